//! Logging: `tracing` to stderr, as text or JSON, filtered by `RUST_LOG` (else `default_filter`).

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

#[derive(Clone, Copy, Debug, Default, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The logging options every binary of the workspace takes.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct Logging {
    /// Log format on stderr (filter with RUST_LOG).
    #[arg(long, global = true, value_enum, default_value_t)]
    pub log_format: LogFormat,
}

impl Logging {
    pub fn init(self, default_filter: &str) {
        init(self.log_format, default_filter);
    }
}

pub fn init(format: LogFormat, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let registry = tracing_subscriber::registry().with(filter);
    let layer = fmt::layer().with_writer(std::io::stderr);
    // A second init (tests, embedded use) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => registry.with(layer).try_init(),
        LogFormat::Json => registry.with(layer.json()).try_init(),
    };
}
