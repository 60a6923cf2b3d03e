//! `briq-bench`: measures briq-operator on this machine (see `make bench` and the README's
//! "Performance" section).

use briq_operator::{bench, telemetry};
use clap::Parser;

#[tokio::main]
async fn main() {
    let args = bench::Args::parse();
    // The operator runs in this process: only its warnings, so the progress lines stay readable.
    telemetry::init(telemetry::LogFormat::Text, "warn");
    if let Err(error) = bench::run(args).await {
        eprintln!("briq-bench: {error:#}");
        std::process::exit(1);
    }
}
