//! A running action's output as it comes: one reader per action, whatever the number of
//! followers. The reader starts the bridge's `follow` in the sandbox (an async exec) and reads
//! its lines by byte offset (`briq_exec_result`, whose wait ends as soon as output comes); each
//! follower reads the pieces kept so far from its own place, then waits for more. What is kept
//! is bounded ([`MAX_READ_BYTES`]), so a follower that reads slowly costs nothing that grows;
//! once no follower is left, the reader stops `follow`. The action itself never depends on it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, Weak},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::{
    bridge::{Command, WORKDIR},
    briq::{ApiKey, ExecRequest, ExecResultArgs, ExecState, SandboxApi, Stream},
};

/// How long one read by offset waits for output: also how late a reader notices that its last
/// follower left.
const READ_WAIT_MS: u64 = 10_000;

/// The most of `follow`'s output one action's reader keeps: the bridge relays 16,384
/// characters at most; this bounds what a sandbox that says more can make the operator hold.
pub const MAX_READ_BYTES: usize = 256 * 1024;

/// A piece of an action's live output, as the bridge's `follow` prints it (one a line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Piece {
    Text {
        stream: Stream,
        text: String,
    },
    /// The live view stops relaying text here (the status keeps the head and the tail).
    Cut {
        cut: u64,
    },
    /// The action ended (`done`, `deadline`, `lost`, …), or the reading did.
    End {
        end: String,
    },
}

impl Piece {
    fn end(why: impl Into<String>) -> Piece {
        Piece::End { end: why.into() }
    }
}

/// The complete lines of `buffer` as pieces, leaving its last partial line in it. A line that
/// is not a piece ends the reading: the sandbox said something the bridge never prints.
pub fn take_lines(buffer: &mut String) -> Vec<Piece> {
    let Some(last) = buffer.rfind('\n') else {
        return Vec::new();
    };
    let rest = buffer.split_off(last + 1);
    let complete = std::mem::replace(buffer, rest);
    complete
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|_| Piece::end("the sandbox printed a line that is not output"))
        })
        .collect()
}

/// One action's output as read so far, shared by its followers.
pub struct Live {
    pieces: Mutex<Vec<Piece>>,
    /// How many pieces there are: a follower waits on its change.
    count: watch::Sender<usize>,
}

impl Live {
    fn push(&self, new: Vec<Piece>) -> bool {
        let mut pieces = self.pieces.lock().unwrap_or_else(|e| e.into_inner());
        let ended = new.iter().any(|p| matches!(p, Piece::End { .. }));
        pieces.extend(new);
        self.count.send_replace(pieces.len());
        ended
    }

    /// A follower from the first piece.
    pub fn follow(self: &Arc<Self>) -> Follower {
        Follower {
            live: self.clone(),
            count: self.count.subscribe(),
            next: 0,
            ended: false,
        }
    }
}

/// One follower's place in an action's output.
pub struct Follower {
    live: Arc<Live>,
    count: watch::Receiver<usize>,
    next: usize,
    ended: bool,
}

impl Follower {
    /// The pieces after those already given, waiting for some; `None` once the end has been
    /// given.
    pub async fn next(&mut self) -> Option<Vec<Piece>> {
        loop {
            let count = *self.count.borrow_and_update();
            if self.next < count {
                let pieces = self.live.pieces.lock().unwrap_or_else(|e| e.into_inner());
                let new = pieces[self.next..count].to_vec();
                self.next = count;
                self.ended = new.iter().any(|p| matches!(p, Piece::End { .. }));
                return Some(new);
            }
            // The sender lives in `live`, held here: `changed` fails only if it were dropped.
            if self.ended || self.count.changed().await.is_err() {
                return None;
            }
        }
    }
}

/// Which action of which sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Action {
    pub sandbox: String,
    pub attempt: String,
}

/// The readers of the actions followed now.
#[derive(Default)]
pub struct Readers {
    live: Mutex<HashMap<Action, Weak<Live>>>,
}

impl Readers {
    /// The output of `action`, read once for all its followers: joined when someone follows it
    /// already, else read from now on (for at most `deadline`).
    pub fn live<S: SandboxApi + 'static>(
        &self,
        sandboxes: Arc<S>,
        key: ApiKey,
        action: Action,
        deadline: Duration,
    ) -> Arc<Live> {
        let mut readers = self.live.lock().unwrap_or_else(|e| e.into_inner());
        readers.retain(|_, live| live.strong_count() > 0);
        if let Some(live) = readers.get(&action).and_then(Weak::upgrade) {
            return live;
        }
        let (count, _) = watch::channel(0);
        let live = Arc::new(Live {
            pieces: Mutex::default(),
            count,
        });
        readers.insert(action.clone(), Arc::downgrade(&live));
        tokio::spawn(read(
            Arc::downgrade(&live),
            sandboxes,
            key,
            action,
            deadline,
        ));
        live
    }
}

/// How often, and how long apart, the reading starts `follow` again while the sandbox does not
/// know the attempt yet: the attempt is recorded before its code reaches the sandbox.
const UNKNOWN_RETRIES: u32 = 40;
const UNKNOWN_PAUSE: Duration = Duration::from_millis(250);

/// How one run of `follow` ended.
enum Reading {
    /// Its pieces, the end among them, are in `live`.
    Ended,
    /// The sandbox does not know the attempt (yet); nothing was kept.
    Unknown,
    /// Nobody follows any more.
    Abandoned,
}

/// Reads `action`'s output into `live` until it ends, the reading fails, or nobody follows.
async fn read<S: SandboxApi>(
    live: Weak<Live>,
    sandboxes: Arc<S>,
    key: ApiKey,
    action: Action,
    deadline: Duration,
) {
    for _ in 0..UNKNOWN_RETRIES {
        match read_once(&live, sandboxes.as_ref(), &key, &action, deadline).await {
            Reading::Ended | Reading::Abandoned => return,
            Reading::Unknown => tokio::time::sleep(UNKNOWN_PAUSE).await,
        }
    }
    if let Some(live) = live.upgrade() {
        live.push(vec![Piece::end("unknown")]);
    }
}

async fn read_once<S: SandboxApi>(
    live: &Weak<Live>,
    sandboxes: &S,
    key: &ApiKey,
    action: &Action,
    deadline: Duration,
) -> Reading {
    let request = ExecRequest {
        argv: Command::Follow {
            attempt: &action.attempt,
            deadline,
        }
        .argv(),
        cwd: Some(WORKDIR.to_owned()),
        env: Default::default(),
        timeout: deadline + Duration::from_secs(5),
        stdin: None,
    };
    let exec = match sandboxes.exec_async(key, &action.sandbox, &request).await {
        Ok(exec) => exec,
        Err(error) => {
            if let Some(live) = live.upgrade() {
                live.push(vec![Piece::end(format!(
                    "briq did not start the reading: {error}"
                ))]);
            }
            return Reading::Ended;
        }
    };
    let stop = async || {
        let _ = sandboxes.exec_stop(key, &action.sandbox, &exec).await;
    };
    let (mut offset, mut read, mut buffer) = (0u64, 0usize, String::new());
    let mut first = true;
    loop {
        if live.strong_count() == 0 {
            stop().await;
            return Reading::Abandoned;
        }
        let arguments = ExecResultArgs {
            briq: action.sandbox.clone(),
            exec: exec.clone(),
            offset: Some(offset),
            stream: Stream::Stdout,
            wait_ms: Some(READ_WAIT_MS),
            max_bytes: None,
        };
        let result = sandboxes.exec_result(key, &arguments).await;
        let Some(live) = live.upgrade() else {
            stop().await;
            return Reading::Abandoned;
        };
        let result = match result {
            Ok(result) => result,
            Err(error) => {
                live.push(vec![Piece::end(format!(
                    "briq stopped answering the reading: {error}"
                ))]);
                return Reading::Ended;
            }
        };
        let output = result.output.unwrap_or_default();
        offset = result.next_offset.unwrap_or(offset + output.len() as u64);
        read += output.len();
        buffer.push_str(&output);
        let mut pieces = take_lines(&mut buffer);
        if first && pieces == [Piece::end("unknown")] {
            return Reading::Unknown;
        }
        first &= pieces.is_empty();
        if read > MAX_READ_BYTES {
            pieces.push(Piece::end(format!(
                "the sandbox printed more than {MAX_READ_BYTES} bytes of live output"
            )));
        } else if result.state != ExecState::Running && output.is_empty() {
            // A bridge without `follow` (released before it) refuses the command.
            let why = match result.exit_code {
                Some(0) => "lost".to_owned(),
                code => format!(
                    "the sandbox's bridge relays no live output (follow exited with {code:?})"
                ),
            };
            pieces.push(Piece::end(why));
        }
        if live.push(pieces) {
            if result.state == ExecState::Running {
                stop().await;
            }
            return Reading::Ended;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::fake::{Call, FakeBriq};

    #[test]
    fn complete_lines_are_pieces_and_a_partial_line_waits_for_its_end() {
        let mut buffer = "{\"stream\":\"stdout\",\"text\":\"a\\n\"}\n{\"stream\":\"std".to_owned();
        assert_eq!(
            take_lines(&mut buffer),
            vec![Piece::Text {
                stream: Stream::Stdout,
                text: "a\n".into()
            }]
        );
        assert_eq!(buffer, "{\"stream\":\"std");
        buffer.push_str("err\",\"text\":\"b\"}\n{\"cut\":16384}\n{\"end\":\"done\"}\n");
        assert_eq!(
            take_lines(&mut buffer),
            vec![
                Piece::Text {
                    stream: Stream::Stderr,
                    text: "b".into()
                },
                Piece::Cut { cut: 16384 },
                Piece::end("done"),
            ]
        );
        assert_eq!(buffer, "");
    }

    #[test]
    fn a_line_the_bridge_never_prints_ends_the_reading() {
        let mut buffer = "__import__('os').system('x')\n".to_owned();
        assert!(matches!(take_lines(&mut buffer)[..], [Piece::End { .. }]));
    }

    fn key() -> ApiKey {
        ApiKey::new("bq_live_test_key_0123456789").unwrap()
    }

    #[tokio::test]
    async fn many_followers_of_one_action_share_one_reading_of_briq() {
        let briq = Arc::new(FakeBriq::default().with_sandbox("bq_1", "s"));
        briq.async_output(concat!(
            "{\"stream\":\"stdout\",\"text\":\"0\\n\"}\n",
            "{\"stream\":\"stderr\",\"text\":\"warn\\n\"}\n",
            "{\"end\":\"done\"}\n"
        ));
        let readers = Readers::default();
        let action = Action {
            sandbox: "bq_1".into(),
            attempt: "0123456789abcdef".into(),
        };
        let deadline = Duration::from_secs(60);
        let first = readers.live(briq.clone(), key(), action.clone(), deadline);
        let second = readers.live(briq.clone(), key(), action.clone(), deadline);
        assert!(Arc::ptr_eq(&first, &second));
        let (mut a, mut b) = (first.follow(), second.follow());
        let mut seen_a = Vec::new();
        while let Some(pieces) = a.next().await {
            seen_a.extend(pieces);
        }
        let mut seen_b = Vec::new();
        while let Some(pieces) = b.next().await {
            seen_b.extend(pieces);
        }
        assert_eq!(seen_a, seen_b);
        assert_eq!(seen_a.last(), Some(&Piece::end("done")));
        let started: Vec<Call> = briq
            .calls()
            .into_iter()
            .filter(|c| matches!(c, Call::ExecAsync { .. }))
            .collect();
        assert_eq!(
            started,
            vec![Call::ExecAsync {
                id: "bq_1".into(),
                command: "follow".into(),
                exec: "ex_1".into()
            }]
        );
    }

    #[tokio::test]
    async fn a_sandbox_that_floods_the_live_output_is_cut_at_the_bound() {
        let briq = Arc::new(FakeBriq::default().with_sandbox("bq_1", "s"));
        let line =
            "{\"stream\":\"stdout\",\"text\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}\n";
        briq.async_output(&line.repeat(2 * MAX_READ_BYTES / line.len()));
        let readers = Readers::default();
        let action = Action {
            sandbox: "bq_1".into(),
            attempt: "0123456789abcdef".into(),
        };
        let live = readers.live(briq, key(), action, Duration::from_secs(60));
        let mut follower = live.follow();
        let mut pieces = Vec::new();
        while let Some(more) = follower.next().await {
            pieces.extend(more);
        }
        let Some(Piece::End { end }) = pieces.last() else {
            panic!("no end: {pieces:?}")
        };
        assert!(end.contains("more than"), "{end}");
    }
}
