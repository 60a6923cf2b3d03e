//! One view of briq's health per API key (the operator talks to one briq URL), shared by every
//! call made with that key: after failures, calls back off together instead of each object
//! retrying on its own schedule, and a down briq is probed by one call at a time.
//!
//! A key is *down* after [`DOWN_AFTER`] calls in a row that briq did not answer (a 5xx, a 429,
//! a refused connection, a timeout, a malformed answer), or at once when briq asks for a pause
//! (`Retry-After`). While it is down, calls are held back without being sent
//! ([`super::Error::HeldBack`], which proves the call had no effect) until the pause is over;
//! then one call goes out as a probe, and the others wait one more pause. The first answer briq
//! gives (a success, or a refusal such as 404 that proves it listens) ends the outage for
//! everyone. The transitions are pure functions of the state and the time, tested below.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use super::error::Error;
use super::key::ApiKey;

/// Calls in a row briq did not answer before a key counts as down: a single 502 is a blip.
pub const DOWN_AFTER: u32 = 3;
/// The first pause of a down key; it doubles per failed probe up to [`LONGEST_PAUSE`].
pub const FIRST_PAUSE: Duration = Duration::from_secs(1);
pub const LONGEST_PAUSE: Duration = Duration::from_secs(15);
/// The longest `Retry-After` honoured for everyone: a longer one is briq's mistake or a
/// gateway's page, and must not silence the operator for hours.
pub const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(300);

/// What became of one call, as far as briq's health is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// briq answered (a success, or a refusal that proves it listens).
    Answered,
    /// briq did not answer; it may have asked for a pause.
    NoAnswer { retry_after: Option<Duration> },
    /// Says nothing about briq (a sandbox not running yet, a held-back call).
    Nothing,
}

impl Heard {
    pub fn of<T>(result: &Result<T, Error>) -> Heard {
        let Err(error) = result else {
            return Heard::Answered;
        };
        match error {
            Error::NotFound { .. } | Error::Unauthorized { .. } | Error::Rejected { .. } => {
                Heard::Answered
            }
            // Held back here, not sent: briq was not asked.
            Error::HeldBack { .. } => Heard::Nothing,
            error if error.unanswered() => Heard::NoAnswer {
                retry_after: error.retry_after(),
            },
            // A sandbox not running yet, a file that came back corrupted, a request that could
            // not be built: nothing about briq's health.
            _ => Heard::Nothing,
        }
    }
}

/// The health of one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct State {
    /// Calls in a row briq did not answer.
    pub failures: u32,
    /// While down: when it went down, and until when calls are held back.
    pub down: Option<Down>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Down {
    pub since: Instant,
    pub until: Instant,
    /// The current pause, doubled per failed probe.
    pub pause: Duration,
}

/// May a call go out at `now`? `Err` holds it back for that long. A down key lets one call
/// through once its pause is over (the probe), and holds the others back one more pause.
pub fn admit(state: &mut State, now: Instant) -> Result<(), Duration> {
    let Some(down) = &mut state.down else {
        return Ok(());
    };
    if now < down.until {
        return Err(down.until - now);
    }
    down.until = now + down.pause;
    Ok(())
}

/// Learns from one call's outcome at `now`.
pub fn heard(state: &mut State, heard: Heard, now: Instant) {
    match heard {
        Heard::Answered => *state = State::default(),
        Heard::Nothing => {}
        Heard::NoAnswer { retry_after } => {
            state.failures = state.failures.saturating_add(1);
            let asked = retry_after.map(|asked| asked.min(LONGEST_RETRY_AFTER));
            if state.failures < DOWN_AFTER && asked.is_none() {
                return;
            }
            let doublings = state.failures.saturating_sub(DOWN_AFTER).min(16);
            let backoff = FIRST_PAUSE
                .saturating_mul(2u32.pow(doublings))
                .min(LONGEST_PAUSE);
            let pause = backoff.max(asked.unwrap_or_default());
            let since = state.down.map_or(now, |down| down.since);
            state.down = Some(Down {
                since,
                until: now + pause,
                pause,
            });
        }
    }
}

/// The health of every key in use, in this process.
#[derive(Debug, Default)]
pub struct Health {
    keys: Mutex<HashMap<u64, State>>,
}

impl Health {
    fn with<T>(&self, key: &ApiKey, apply: impl FnOnce(&mut State) -> T) -> T {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        apply(keys.entry(key.fingerprint()).or_default())
    }

    /// Whether a call with `key` may go out now; `Err` holds it back for that long.
    pub fn admit(&self, key: &ApiKey) -> Result<(), Duration> {
        self.with(key, |state| admit(state, Instant::now()))
    }

    pub fn heard<T>(&self, key: &ApiKey, result: &Result<T, Error>) {
        let heard_of = Heard::of(result);
        if heard_of != Heard::Nothing {
            self.with(key, |state| heard(state, heard_of, Instant::now()));
        }
    }

    /// How many keys briq does not answer now.
    pub fn unreachable(&self) -> usize {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.values().filter(|state| state.down.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const NO_ANSWER: Heard = Heard::NoAnswer { retry_after: None };

    #[test]
    fn a_blip_holds_nothing_back_and_an_answer_forgets_it() {
        let t0 = Instant::now();
        let mut state = State::default();
        heard(&mut state, NO_ANSWER, t0);
        heard(&mut state, NO_ANSWER, t0);
        assert_eq!(admit(&mut state, t0), Ok(()));
        heard(&mut state, Heard::Answered, t0);
        assert_eq!(state, State::default());
        heard(&mut state, NO_ANSWER, t0);
        heard(&mut state, Heard::Nothing, t0);
        assert_eq!(
            state.failures, 1,
            "a held-back call or a booting sandbox says nothing"
        );
    }

    #[test]
    fn a_down_key_holds_calls_back_and_lets_one_probe_through_per_pause() {
        let t0 = Instant::now();
        let mut state = State::default();
        for _ in 0..DOWN_AFTER {
            heard(&mut state, NO_ANSWER, t0);
        }
        // (time after t0, admitted or held back for, what the probe hears)
        assert_eq!(admit(&mut state, t0), Err(S));
        assert_eq!(admit(&mut state, t0 + S / 2), Err(S / 2));
        assert_eq!(admit(&mut state, t0 + S), Ok(()), "the probe");
        assert_eq!(admit(&mut state, t0 + S), Err(S), "the others wait");
        heard(&mut state, NO_ANSWER, t0 + S + S / 10);
        let down = state.down.unwrap();
        assert_eq!(down.pause, 2 * S, "the pause doubles per failed probe");
        assert_eq!(down.since, t0);
        for _ in 0..10 {
            heard(&mut state, NO_ANSWER, t0);
        }
        assert_eq!(state.down.unwrap().pause, LONGEST_PAUSE);
        heard(&mut state, Heard::Answered, t0 + 60 * S);
        assert_eq!(admit(&mut state, t0 + 60 * S), Ok(()));
        assert_eq!(state, State::default());
    }

    #[test]
    fn retry_after_holds_every_call_back_at_once_within_a_bound() {
        let t0 = Instant::now();
        let table = [
            (Some(30 * S), 30 * S),
            (Some(S / 2), S),
            (Some(86_400 * S), LONGEST_RETRY_AFTER),
        ];
        for (asked, pause) in table {
            let mut state = State::default();
            heard(&mut state, Heard::NoAnswer { retry_after: asked }, t0);
            assert_eq!(admit(&mut state, t0), Err(pause), "{asked:?}");
        }
    }

    #[test]
    fn what_a_call_says_of_briq() {
        let answered: Result<(), Error> = Ok(());
        assert_eq!(Heard::of(&answered), Heard::Answered);
        let gone: Result<(), Error> = Err(Error::NotFound {
            message: "no".into(),
            request_id: None,
        });
        assert_eq!(Heard::of(&gone), Heard::Answered);
        let unavailable: Result<(), Error> = Err(Error::Unavailable {
            status: 503,
            code: super::super::api::ErrorCode::Unavailable,
            message: "down".into(),
            retry_after: Some(S),
            request_id: None,
        });
        assert_eq!(
            Heard::of(&unavailable),
            Heard::NoAnswer {
                retry_after: Some(S)
            }
        );
        let held: Result<(), Error> = Err(Error::HeldBack { wait: S });
        assert_eq!(Heard::of(&held), Heard::Nothing);
    }
}
