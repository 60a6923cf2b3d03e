//! Timestamped progress lines: `[  12.3s] message`.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Stdout,
    /// For a command whose stdout holds its result.
    Stderr,
    /// Tests: no lines at all.
    Nowhere,
}

#[derive(Debug, Clone)]
pub struct Progress {
    started: Instant,
    target: Target,
}

impl Progress {
    /// Lines on stdout.
    pub fn start() -> Self {
        Progress {
            started: Instant::now(),
            target: Target::Stdout,
        }
    }

    /// Lines on stderr, for a command whose stdout holds its result.
    pub fn start_on_stderr() -> Self {
        Progress {
            target: Target::Stderr,
            ..Progress::start()
        }
    }

    /// No lines (the test harness).
    pub fn quiet() -> Self {
        Progress {
            target: Target::Nowhere,
            ..Progress::start()
        }
    }

    pub fn step(&self, message: impl std::fmt::Display) {
        let line = || format!("[{:>6.1}s] {message}", self.elapsed().as_secs_f64());
        match self.target {
            Target::Stdout => println!("{}", line()),
            Target::Stderr => eprintln!("{}", line()),
            Target::Nowhere => {}
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}
