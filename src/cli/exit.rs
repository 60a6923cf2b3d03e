//! The exit status of a command ([`Exit`]).

use std::io::Write as _;

/// How a command ended, as the process's exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Done; the Execution (if any) succeeded or has not finished.
    Ok = 0,
    /// The Execution failed: the code raised, timed out, or the executor could not run it.
    ExecutionFailed = 1,
    /// Nothing could be run or shown: usage, cluster or executor problem.
    Trouble = 2,
}

impl Exit {
    pub fn exit(self) -> ! {
        let _ = std::io::stdout().flush();
        std::process::exit(self as i32)
    }
}
