//! `spec.suspend` through the real `executor::reconcile`: `Suspending` first, then the kernel's
//! namespace saved and the sandbox stopped (`Suspended`); `spec.suspend: false` starts the
//! sandbox and a kernel and restores the namespace (`KernelReady`, `Resumed`).

use std::{sync::Arc, time::Duration};

use http::Method;
use kube::runtime::controller::Action;
use tokio::sync::mpsc;

use super::world::{EVENTS_PATH, SANDBOX, Served, World, briq_with_sandbox, ready_executor};
use crate::{bridge::fake::Call, controller::executor, crd::BriqExecutor};

#[tokio::test]
async fn a_suspended_executor_saves_its_namespace_stops_its_sandbox_and_restores_it_on_resume() {
    let (mut world, mut server) = World::new(briq_with_sandbox());
    let mut asked = ready_executor();
    asked.spec.suspend = true;
    world.cache_executor(&asked);
    // What the watch delivers after each reconcile's writes.
    let (delivered, mut watch) = mpsc::unbounded_channel::<BriqExecutor>();
    let verifier = {
        let mut served = Served {
            executor: asked.clone(),
            version: 5,
        };
        tokio::spawn(async move {
            // Reconcile 1: Suspending, and nothing touched yet.
            served.read(&mut server).await;
            let suspending = served.status_write(&mut server).await;
            assert_eq!(suspending.condition_reason("Ready"), Some("Suspending"));
            delivered.send(served.executor.clone()).unwrap();
            // Reconcile 2: saved and stopped, then Suspended.
            served.read(&mut server).await;
            let suspended = served.status_write(&mut server).await;
            assert_eq!(suspended.condition_reason("Ready"), Some("Suspended"));
            let suspension = &suspended.body["status"]["suspension"];
            assert!(suspension["suspendedTime"].is_string(), "{suspended:?}");
            assert_eq!(
                (&suspension["savedNames"], &suspension["savedBytes"]),
                (&1.into(), &10.into())
            );
            assert_eq!(suspended.body["status"]["sandboxId"], SANDBOX);
            let event = server.expect(Method::POST, EVENTS_PATH).await.created();
            assert_eq!(event.body["reason"], "Suspended");
            // The user asks it back.
            served.executor.spec.suspend = false;
            served.executor.metadata.generation = Some(2);
            served.bump();
            delivered.send(served.executor.clone()).unwrap();
            // Reconcile 3: Resuming, then Ready with the namespace restored.
            served.read(&mut server).await;
            let resuming = served.status_write(&mut server).await;
            assert_eq!(resuming.condition_reason("Ready"), Some("Resuming"));
            let resumed = served.status_write(&mut server).await;
            assert_eq!(resumed.condition_reason("Ready"), Some("KernelReady"));
            assert_eq!(resumed.condition_reason("Suspended"), Some("Resumed"));
            assert!(
                resumed.body["status"]["suspension"]["resumedTime"].is_string(),
                "{resumed:?}"
            );
            let event = server.expect(Method::POST, EVENTS_PATH).await.created();
            assert_eq!(event.body["reason"], "Resumed");
            server.done().await;
        })
    };
    let suspend = executor::reconcile(Arc::new(asked), world.executor_ctx()).await;
    let touched_when_suspending = world.briq().calls().len();
    let suspending = watch.recv().await.expect("the watch delivers Suspending");
    world.cache_executor(&suspending);
    let stop = executor::reconcile(Arc::new(suspending), world.executor_ctx()).await;
    let stopped_at = world.briq().calls().len();
    let resume_asked = watch
        .recv()
        .await
        .expect("the watch delivers the resume asked");
    world.cache_executor(&resume_asked);
    let resume = executor::reconcile(Arc::new(resume_asked), world.executor_ctx()).await;
    let all = world.finish(verifier).await;

    assert_eq!(suspend.unwrap(), Action::await_change());
    assert_eq!(stop.unwrap(), Action::await_change());
    assert_eq!(resume.unwrap(), Action::requeue(Duration::from_secs(30)));
    let id = || SANDBOX.to_owned();
    assert_eq!(
        touched_when_suspending, 0,
        "Suspending is written before anything is touched"
    );
    assert_eq!(
        all[..stopped_at],
        [
            Call::Get { id: id() },
            Call::exec(SANDBOX, "save-state"),
            Call::Stop { id: id() },
        ]
    );
    assert_eq!(
        all[stopped_at..],
        [
            Call::Get { id: id() },
            Call::Start { id: id() },
            Call::exec(SANDBOX, "start-kernel"),
            Call::exec(SANDBOX, "restore-state"),
        ]
    );
}
