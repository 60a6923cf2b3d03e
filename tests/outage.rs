//! briq's bad days: its gateway goes down for a while, or answers an error after acting. No
//! Execution is lost to it: an outcome briq left unknown is asked of the sandbox's attempt
//! journal once briq answers again, so the code runs exactly once, the Python state is kept and
//! the executor stays usable.

mod support;

use std::time::{Duration, Instant};

use briq_dev::local_server::{DeclaredChange, Operation, Outage};
use briq_operator::crd::{BriqExecutor, Execution};
use serde_json::json;
use support::{
    Operator, TestEnv, condition, create_execution, create_executor, finished, output, reason, run,
    sandbox_server, wait_for, wait_ready,
};

const OUTAGE: Duration = Duration::from_secs(40);

/// Counts its runs in a file of the kernel user's home, then answers with the executor's `X`;
/// the last `sleep` seconds of it run after the count.
fn counted(sleep: u32) -> String {
    format!(
        "import os, time\nopen(os.path.expanduser('~/runs.txt'), 'a').write('x')\n\
         time.sleep({sleep})\nX"
    )
}

/// How often `counted` ran on `executor`, asked by an Execution of its own.
async fn runs(env: &TestEnv, executor: &str) -> String {
    let name = format!("{executor}-runs");
    let code = "import os\nlen(open(os.path.expanduser('~/runs.txt')).read())";
    let counted = run(env, &name, executor, code).await;
    assert_eq!(reason(&counted), "Completed", "{:?}", counted.status);
    output(&counted)
}

/// The gateway answers 503 to every call for 40 s and performs none. One Execution is in flight
/// when it begins (its answer comes back as a 503), two are sent during it. Each ends with its
/// real result, its code ran exactly once, its executor keeps its Python state and stays Ready.
#[tokio::test]
async fn a_40s_gateway_outage_costs_no_executor_no_second_run_and_no_state() {
    let env = TestEnv::new("outage").await;
    let operator = Operator::start(&env).await;
    let admin = operator.admin();
    let names = ["py0", "py1", "py2"];
    for name in names {
        create_executor(&env, name, json!({})).await;
    }
    for (i, name) in names.iter().enumerate() {
        wait_ready(&env, name).await;
        let set = run(&env, &format!("{name}-set"), name, &format!("X = {i}")).await;
        assert_eq!(reason(&set), "Completed", "{:?}", set.status);
    }

    // In flight: the exec has reached the sandbox, whose code still sleeps when briq goes down.
    let execs = admin.stats().await.unwrap().calls(Operation::Exec);
    create_execution(&env, "in-flight", "py0", &counted(5)).await;
    briq_dev::wait::poll(
        Duration::from_secs(30),
        Duration::from_millis(20),
        "the exec reaches the sandbox",
        || async { Ok(admin.stats().await?.calls(Operation::Exec) > execs) },
    )
    .await
    .unwrap();
    admin.begin_outage(&Outage::new(503, OUTAGE)).await.unwrap();
    let began = Instant::now();
    create_execution(&env, "during-1", "py1", &counted(0)).await;
    create_execution(&env, "during-2", "py2", &counted(0)).await;

    // While briq is down, each says it waits for briq, and why: the 503 its exec got, or, once
    // three calls in a row went unanswered (the execs', or the executors' probes, whichever came
    // first), that calls are held back for a pause.
    for name in ["in-flight", "during-1", "during-2"] {
        let waiting = wait_for(&env.api::<Execution>(), name, 30, |e| {
            reason(e) == "WaitingForBriq"
        })
        .await;
        let message = condition(&waiting, "Succeeded").2;
        assert!(
            message.contains("HTTP 503") || message.contains("briq is not answering"),
            "{name}: {message}"
        );
        assert!(message.contains("never sent twice"), "{name}: {message}");
    }
    // The executors stay Ready and say briq is unreachable (each probes within 30 s); the
    // operator holds its calls back and says so.
    for name in names {
        let unreachable = wait_for(&env.api::<BriqExecutor>(), name, 35, |e| {
            condition(e, "BriqReachable").0 == "False"
        })
        .await;
        assert_eq!(condition(&unreachable, "Ready").0, "True", "{name}");
        assert_eq!(
            condition(&unreachable, "BriqReachable").1,
            "BriqUnreachable"
        );
    }
    assert_eq!(operator.briq_unreachable_keys(), 1);
    assert!(
        began.elapsed() < OUTAGE,
        "the outage outlasted the checks made during it"
    );

    for (i, (name, executor)) in [
        ("in-flight", "py0"),
        ("during-1", "py1"),
        ("during-2", "py2"),
    ]
    .into_iter()
    .enumerate()
    {
        let done = finished(&env, name, OUTAGE.as_secs() + 60).await;
        assert_eq!(reason(&done), "Completed", "{name}: {:?}", done.status);
        assert_eq!(
            output(&done),
            i.to_string(),
            "{name} kept the executor's state"
        );
        assert_eq!(runs(&env, executor).await, "1", "{name} ran exactly once");
        let ready = env.api::<BriqExecutor>().get(executor).await.unwrap();
        assert!(!ready.status.clone().unwrap().unusable, "{executor}");
        assert_eq!(condition(&ready, "Ready").0, "True", "{executor}");
    }
    assert_eq!(operator.briq_unreachable_keys(), 0, "briq answers again");
    for name in names {
        // Gone at the executor's next probe.
        wait_for(&env.api::<BriqExecutor>(), name, 45, |e| {
            condition(e, "BriqReachable").0.is_empty()
        })
        .await;
    }
}

/// briq's server no longer declares an argument the operator sends (its exec without `stdin`):
/// the executor's status names the tool and the parameter within seconds, and briq gets no call
/// but the interface check — no create, no loop of refusals.
#[tokio::test]
async fn a_server_lacking_an_argument_the_operator_sends_is_named_in_status_and_gets_no_other_call()
{
    let env = TestEnv::new("mismatch").await;
    let server = sandbox_server().await;
    let admin = server.admin();
    admin
        .declare(&DeclaredChange::DropParameter {
            tool: "briq_exec".into(),
            parameter: "stdin".into(),
        })
        .await
        .unwrap();
    let operator = Operator::start_on(&env, env.client.clone(), server, |_| {});
    create_executor(&env, "py", json!({})).await;
    let named = wait_for(&env.api::<BriqExecutor>(), "py", 30, |e| {
        condition(e, "Ready").1 == "BriqInterfaceMismatch"
    })
    .await;
    let (status, _, message) = condition(&named, "Ready");
    assert_eq!(status, "False");
    assert!(
        message.contains("briq_exec.stdin: sent, but not declared"),
        "{message}"
    );
    // Reconciled again meanwhile (its error requeues it), it still makes no call.
    create_execution(&env, "waits", "py", "1 + 1").await;
    let stats = admin.stats().await.unwrap();
    let others: Vec<_> = stats
        .calls
        .iter()
        .filter(|(operation, _)| !matches!(operation, Operation::Initialize | Operation::ListTools))
        .collect();
    assert!(others.is_empty(), "no other call: {:?}", stats.calls);
    assert_eq!(stats.calls(Operation::ListTools), 1, "{:?}", stats.calls);
    drop(operator);
}
