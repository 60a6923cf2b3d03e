//! Reading a bridge command out of an exec's argv, and the directives a simulated action's code
//! may carry.

use std::path::{Component, Path};
use std::time::Duration;

/// The bridge subcommands a simulated sandbox answers.
const SUBCOMMANDS: [&str; 5] = ["setup", "start-kernel", "probe", "run", "recall"];

/// A bridge command, as the operator builds it (`briq_operator::bridge::Command::argv`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum BridgeCall {
    /// `setup`; `self_install` moves `script` into place as `.briq/bridge.py`.
    Setup {
        self_install: bool,
    },
    StartKernel,
    Probe,
    /// The code comes on stdin.
    Run {
        attempt: Option<String>,
        timeout: Duration,
    },
    Recall {
        attempt: String,
    },
}

/// One exec of the bridge: the command and the script file it was run from, if any (none for
/// `python3 -c SOURCE …`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Invocation<'a> {
    pub script: Option<&'a str>,
    pub call: BridgeCall,
}

/// Why an argv is not a bridge command a simulated sandbox can answer.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unrecognised {
    #[error("{0:?} is not python3")]
    NotPython(String),
    #[error("no bridge subcommand ({})", SUBCOMMANDS.join(", "))]
    NoSubcommand,
    #[error("{option} needs a value")]
    MissingValue { option: &'static str },
    #[error("{option} {value:?} is not a number of seconds")]
    BadSeconds { option: &'static str, value: String },
}

/// Recognises `python3 [interpreter options] (SCRIPT | -c SOURCE) SUBCOMMAND [options]`. The
/// subcommand is the first element from index 2 on that is exactly one of [`SUBCOMMANDS`], so
/// both `python3 .briq/bridge.py run …` and `python3 -I -S -c SOURCE run …` are understood
/// (the source cannot be mistaken for one: it is a whole program, never a bare word).
pub(crate) fn parse(argv: &[String]) -> Result<Invocation<'_>, Unrecognised> {
    let program = argv.first().map(String::as_str).unwrap_or_default();
    let name = Path::new(program)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if !name.starts_with("python") {
        return Err(Unrecognised::NotPython(program.to_owned()));
    }
    let at = (2..argv.len())
        .find(|&i| SUBCOMMANDS.contains(&argv[i].as_str()))
        .ok_or(Unrecognised::NoSubcommand)?;
    let script = argv
        .get(1)
        .map(String::as_str)
        .filter(|first| !first.starts_with('-'));
    let options = &argv[at + 1..];
    let value = |option: &'static str| {
        options
            .iter()
            .position(|o| o == option)
            .map(|i| {
                options
                    .get(i + 1)
                    .cloned()
                    .ok_or(Unrecognised::MissingValue { option })
            })
            .transpose()
    };
    let call = match argv[at].as_str() {
        "setup" => BridgeCall::Setup {
            self_install: options.iter().any(|o| o == "--self-install"),
        },
        "start-kernel" => BridgeCall::StartKernel,
        "probe" => BridgeCall::Probe,
        "run" => BridgeCall::Run {
            attempt: value("--attempt")?,
            timeout: match value("--timeout")? {
                Some(seconds) => seconds_of("--timeout", &seconds)?,
                None => DEFAULT_RUN_TIMEOUT,
            },
        },
        "recall" => BridgeCall::Recall {
            attempt: value("--attempt")?.ok_or(Unrecognised::MissingValue {
                option: "--attempt",
            })?,
        },
        _ => unreachable!("found among SUBCOMMANDS"),
    };
    Ok(Invocation { script, call })
}

/// The bridge's own default for `run --timeout`.
const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(30);

fn seconds_of(option: &'static str, value: &str) -> Result<Duration, Unrecognised> {
    value
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| Unrecognised::BadSeconds {
            option,
            value: value.to_owned(),
        })
}

/// Whether `script` names a file inside the working directory (relative, no `..`): anything
/// else is treated as a file that cannot be opened.
pub(crate) fn is_inside(script: &str) -> bool {
    let path = Path::new(script);
    path.components().next().is_some()
        && path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// How long a simulated action takes: the first `# sleep-ms: N` comment line, else no time.
pub(crate) fn sleep_of(code: &str) -> Duration {
    code.lines()
        .filter_map(|line| line.trim().strip_prefix('#'))
        .filter_map(|comment| comment.trim().strip_prefix("sleep-ms:"))
        .find_map(|n| n.trim().parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_millis)
}

/// What a simulated action outputs: its last line that is neither blank nor a comment, as
/// written (a kernel would show the value of a final expression; echoing it keeps the answer
/// well formed without evaluating anything).
pub(crate) fn output_of(code: &str) -> Option<String> {
    code.lines()
        .map(str::trim)
        .rfind(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn recognises_bridge_commands() {
        let run = |attempt: Option<&str>, seconds: u64| BridgeCall::Run {
            attempt: attempt.map(str::to_owned),
            timeout: Duration::from_secs(seconds),
        };
        let cases: [(&str, Option<&str>, BridgeCall); 8] = [
            (
                "python3 .briq/bridge-00ff.py setup --self-install --deadline 55.000 --requirement pandas",
                Some(".briq/bridge-00ff.py"),
                BridgeCall::Setup { self_install: true },
            ),
            (
                "python3 .briq/bridge.py setup --deadline 55.000",
                Some(".briq/bridge.py"),
                BridgeCall::Setup {
                    self_install: false,
                },
            ),
            (
                "python3 .briq/bridge.py start-kernel --state-dir .briq/state --deadline 30.000",
                Some(".briq/bridge.py"),
                BridgeCall::StartKernel,
            ),
            (
                "python3 .briq/bridge.py probe --state-dir .briq/state",
                Some(".briq/bridge.py"),
                BridgeCall::Probe,
            ),
            (
                "python3 .briq/bridge.py run --state-dir .briq/state --code - --timeout 30.000 --attempt 0123abcd",
                Some(".briq/bridge.py"),
                run(Some("0123abcd"), 30),
            ),
            // The client form: the program on the command line, then the subcommand.
            (
                "python3 -I -S -c import_sys;main() run --state-dir .briq/state --timeout 2.5 --attempt ab",
                None,
                BridgeCall::Run {
                    attempt: Some("ab".into()),
                    timeout: Duration::from_millis(2500),
                },
            ),
            (
                "/venv/bin/python3 .briq/bridge.py run --attempt ab",
                Some(".briq/bridge.py"),
                run(Some("ab"), 30),
            ),
            (
                "python3 .briq/bridge.py recall --attempt 0123abcd",
                Some(".briq/bridge.py"),
                BridgeCall::Recall {
                    attempt: "0123abcd".into(),
                },
            ),
        ];
        for (line, script, call) in cases {
            let argv = argv(line);
            assert_eq!(parse(&argv), Ok(Invocation { script, call }), "{line}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_bridge_command() {
        let cases = [
            ("true", Unrecognised::NotPython("true".into())),
            ("python3 -c pass", Unrecognised::NoSubcommand),
            // The subcommand is never argv[1]: that is the script or an interpreter option.
            ("python3 run --attempt ab", Unrecognised::NoSubcommand),
            (
                "python3 .briq/bridge.py recall",
                Unrecognised::MissingValue {
                    option: "--attempt",
                },
            ),
            (
                "python3 .briq/bridge.py run --attempt",
                Unrecognised::MissingValue {
                    option: "--attempt",
                },
            ),
            (
                "python3 .briq/bridge.py run --timeout soon",
                Unrecognised::BadSeconds {
                    option: "--timeout",
                    value: "soon".into(),
                },
            ),
        ];
        for (line, error) in cases {
            let argv = argv(line);
            assert_eq!(parse(&argv), Err(error), "{line}");
        }
        assert_eq!(parse(&[]), Err(Unrecognised::NotPython(String::new())));
    }

    #[test]
    fn scripts_stay_inside_the_working_directory() {
        for (script, inside) in [
            (".briq/bridge.py", true),
            ("./.briq/bridge-1.py", true),
            ("/etc/passwd", false),
            ("../bridge.py", false),
            (".briq/../../x.py", false),
            ("", false),
        ] {
            assert_eq!(is_inside(script), inside, "{script}");
        }
    }

    #[test]
    fn sleep_directive() {
        for (code, ms) in [
            ("1 + 1", 0),
            ("# sleep-ms: 5\n1 + 1", 5),
            ("x = 1\n  #sleep-ms:250  \nx", 250),
            ("# sleep-ms: soon\n# sleep-ms: 7\n1", 7),
            ("# sleep-ms: -3\n1", 0),
            ("print('# sleep-ms: 9')", 0),
        ] {
            assert_eq!(sleep_of(code), Duration::from_millis(ms), "{code:?}");
        }
    }

    #[test]
    fn output_is_the_last_line_of_code() {
        for (code, output) in [
            ("# sleep-ms: 5\n1 + 1\n", Some("1 + 1")),
            ("x = 2\n  x * 3  \n\n# done", Some("x * 3")),
            ("# only a comment", None),
            ("", None),
        ] {
            assert_eq!(output_of(code).as_deref(), output, "{code:?}");
        }
    }
}
