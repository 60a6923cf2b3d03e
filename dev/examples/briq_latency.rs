//! Median latency of `create_sandbox` and of a trivial exec (`true`), measured with the real
//! briq client against an in-process local sandbox server.
//!
//!     cargo run --release -p briq-dev --example briq_latency [RUNS]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use briq_dev::local_server::{self, Config};
use briq_operator::briq::{
    ApiKey, BriqClient, ClientOptions, CreateSandbox, ExecRequest, SandboxApi as _,
};

fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let runs: usize = std::env::args().nth(1).map_or(Ok(20), |n| n.parse())?;
    anyhow::ensure!(runs > 0, "RUNS must be at least 1");
    let server = local_server::spawn(Config::new(ApiKey::new("latency-bench")?)).await?;
    let client = BriqClient::new(ClientOptions::local(server.url()))?;
    let key = server.api_key().clone();

    let create = CreateSandbox {
        name: "latency".to_owned(),
        image: "python".to_owned(),
        size: None,
        sleep: "30m".to_owned(),
        env: BTreeMap::new(),
    };
    let trivial = ExecRequest {
        argv: vec!["true".to_owned()],
        cwd: None,
        env: BTreeMap::new(),
        timeout: Duration::from_secs(10),
        stdin: None,
    };

    let mut creates = Vec::with_capacity(runs);
    let mut ids = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        ids.push(client.create_sandbox(&key, &create).await?.id);
        creates.push(started.elapsed());
    }
    let mut execs = Vec::with_capacity(runs);
    for id in &ids {
        let started = Instant::now();
        let output = client.exec(&key, id, &trivial).await?;
        execs.push(started.elapsed());
        anyhow::ensure!(output.exit_code == Some(0), "`true` failed: {output:?}");
    }
    for id in &ids {
        client.destroy_sandbox(&key, id).await?;
    }
    server.shutdown().await;

    println!("runs: {runs}");
    println!("create_sandbox median: {:.2} ms", median(creates));
    println!("exec `true` median: {:.2} ms", median(execs));
    Ok(())
}
