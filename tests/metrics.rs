//! The HTTP endpoints of a running operator: /healthz, /readyz and /metrics scraped after 100
//! Executions, with label sets that stay bounded whatever the number of objects.

mod ops;
mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use briq_operator::crd::reasons::ExecutionReason;
use ops::{Instance, until};
use serde_json::json;
use support::{TestEnv, create_execution, create_executor, finished, reason};

/// Every sample of an OpenMetrics text: series (name and labels) → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a sample line");
            (series.to_owned(), value.parse().expect("a numeric sample"))
        })
        .collect()
}

/// (name, labels) of a series such as `name{a="1",b="2"}`.
fn parse(series: &str) -> (String, BTreeMap<String, String>) {
    let Some((name, labels)) = series.split_once('{') else {
        return (series.to_owned(), BTreeMap::new());
    };
    let labels = labels
        .trim_end_matches('}')
        .split(',')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap();
            (key.to_owned(), value.trim_matches('"').to_owned())
        })
        .collect();
    (name.to_owned(), labels)
}

#[tokio::test]
async fn metrics_are_scraped_and_their_labels_stay_bounded_after_100_executions() {
    let env = TestEnv::new("metrics").await;
    let server = ops::sandbox_server().await;
    let config = ops::kube_config(&env).await;
    let operator = Instance::start(config, &server, ops::settings(&env, &server), None)
        .await
        .unwrap();

    let (code, body) = operator.get("/healthz").await.unwrap();
    assert_eq!((code, body.trim()), (200, "ok"));
    until(Duration::from_secs(30), "the caches sync", || {
        operator.leading()
    })
    .await;
    let (code, body) = operator.get("/readyz").await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("controllers running"), "{body}");

    for executor in ["left", "right"] {
        create_executor(&env, executor, json!({})).await;
    }
    for executor in ["left", "right"] {
        support::wait_ready(&env, executor).await;
    }

    // 100 Executions over two executors: 80 succeed, 20 raise.
    let mut series_after_ten = BTreeSet::new();
    for round in 0..10 {
        let mut names = Vec::new();
        for i in 0..10 {
            let n = round * 10 + i;
            let executor = if n % 2 == 0 { "left" } else { "right" };
            let code = if n % 5 == 4 {
                "1 / 0".to_owned()
            } else {
                format!("{n} * 2")
            };
            let name = format!("run-{n:03}");
            create_execution(&env, &name, executor, &code).await;
            names.push((name, n % 5 == 4));
        }
        for (name, fails) in &names {
            let expected = if *fails { "CodeError" } else { "Completed" };
            assert_eq!(reason(&finished(&env, name, 120).await), expected, "{name}");
        }
        if round == 0 {
            let (_, text) = operator.get("/metrics").await.unwrap();
            series_after_ten = samples(&text)
                .into_keys()
                .map(|s| parse(&s).0 + &format!("{:?}", parse(&s).1))
                .collect();
        }
    }

    let (code, text) = operator.get("/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        text.ends_with("# EOF\n"),
        "OpenMetrics text ends with # EOF"
    );
    let samples = samples(&text);
    let value = |series: &str| {
        *samples
            .get(series)
            .unwrap_or_else(|| panic!("{series} missing from:\n{text}"))
    };
    assert_eq!(
        value("briq_operator_executions_finished_total{reason=\"Completed\"}"),
        80.0
    );
    assert_eq!(
        value("briq_operator_executions_finished_total{reason=\"CodeError\"}"),
        20.0
    );
    assert_eq!(
        value("briq_operator_execution_duration_seconds_count"),
        100.0
    );
    assert_eq!(value("briq_operator_executor_ready_seconds_count"), 2.0);
    assert!(value("briq_operator_executor_ready_seconds_sum") > 0.0);
    assert!(value("briq_operator_reconciles_total{controller=\"execution\"}") >= 100.0);
    assert!(value("briq_operator_reconciles_total{controller=\"executor\"}") >= 2.0);
    assert!(
        value("briq_operator_reconcile_duration_seconds_count{controller=\"execution\"}") >= 100.0
    );
    assert_eq!(value("briq_operator_sandboxes_live"), 2.0);
    assert_eq!(value("briq_operator_executions_queued"), 0.0);
    assert_eq!(value("briq_operator_executions_running"), 0.0);
    assert_eq!(value("briq_operator_leader"), 1.0);

    // Labels come from fixed sets only: never a name, namespace, UID or error text.
    let allowed_reasons: BTreeSet<&str> = ExecutionReason::terminal().map(|r| r.as_str()).collect();
    let executor_endings: BTreeSet<&str> = briq_operator::metrics::EXECUTOR_ENDINGS
        .iter()
        .map(|r| r.as_str())
        .collect();
    for series in samples.keys() {
        let (name, labels) = parse(series);
        assert!(name.starts_with("briq_operator_"), "{series}");
        for (key, value) in &labels {
            match key.as_str() {
                "controller" => assert!(
                    ["executor", "execution", "pool"].contains(&value.as_str()),
                    "{series}"
                ),
                "reason" if name.starts_with("briq_operator_executors_ended") => {
                    assert!(executor_endings.contains(value.as_str()), "{series}")
                }
                "reason" => assert!(allowed_reasons.contains(value.as_str()), "{series}"),
                "outcome" => assert!(["warm", "cold"].contains(&value.as_str()), "{series}"),
                "le" => assert!(value == "+Inf" || value.parse::<f64>().is_ok(), "{series}"),
                other => panic!("unexpected label {other} in {series}"),
            }
            assert!(
                !value.contains(&env.namespace) && !value.contains("run-"),
                "{series}"
            );
        }
    }
    // Ten times the Executions, the same series: the count does not grow with objects.
    let series_now: BTreeSet<String> = samples
        .keys()
        .map(|s| parse(s).0 + &format!("{:?}", parse(s).1))
        .collect();
    assert_eq!(
        series_now, series_after_ten,
        "no new series after 90 more Executions"
    );
    assert!(samples.len() < 150, "{} series", samples.len());
}

/// The value of the unlabelled gauge `name` in a /metrics text.
fn gauge(text: &str, name: &str) -> f64 {
    samples(text)
        .get(name)
        .copied()
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

#[tokio::test]
async fn deleted_objects_leave_nothing_in_the_operators_memory() {
    let env = TestEnv::new("bookkeeping").await;
    let server = ops::sandbox_server().await;
    let config = ops::kube_config(&env).await;
    let operator = Instance::start(config, &server, ops::settings(&env, &server), None)
        .await
        .unwrap();
    for executor in ["left", "right"] {
        create_executor(&env, executor, json!({})).await;
    }
    for executor in ["left", "right"] {
        support::wait_ready(&env, executor).await;
    }
    for n in 0..6 {
        let executor = if n % 2 == 0 { "left" } else { "right" };
        let code = if n % 3 == 2 { "1 / 0" } else { "n = 1" };
        create_execution(&env, &format!("run-{n}"), executor, code).await;
    }
    for n in 0..6 {
        finished(&env, &format!("run-{n}"), 120).await;
    }
    // One that waits for an executor that never comes.
    create_execution(&env, "orphan", "missing", "1").await;
    let (_, text) = operator.get("/metrics").await.unwrap();
    let kept = gauge(&text, "briq_operator_bookkeeping_entries");
    assert!(
        kept >= 4.0,
        "each executor that ran code has its lock and count: {kept}"
    );

    let executions = env.api::<briq_operator::crd::Execution>();
    executions
        .delete_collection(&Default::default(), &Default::default())
        .await
        .unwrap();
    let executors = env.api::<briq_operator::crd::BriqExecutor>();
    for executor in ["left", "right"] {
        executors
            .delete(executor, &Default::default())
            .await
            .unwrap();
    }
    for executor in ["left", "right"] {
        support::wait_deleted(&executors, executor, 60).await;
    }
    let operator = &operator;
    let emptied = briq_dev::wait::poll(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "the bookkeeping empties",
        || async move {
            let (_, text) = operator.get("/metrics").await?;
            Ok(gauge(&text, "briq_operator_bookkeeping_entries") == 0.0)
        },
    )
    .await;
    let (_, text) = operator.get("/metrics").await.unwrap();
    assert!(
        emptied.is_ok(),
        "{} entries left after the objects went",
        gauge(&text, "briq_operator_bookkeeping_entries")
    );
}
