use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::{
    bridge::state::Unsaved,
    controller::executor::{
        fixtures::{annotations, ready, status},
        step::{Asked, Step, decide},
    },
    crd::{BriqExecutorSpec, BriqExecutorStatus, ForkFrom},
};

fn executor(name: &str, uid: &str, fork_from: Option<&str>) -> BriqExecutor {
    let mut executor = BriqExecutor::new(
        name,
        BriqExecutorSpec {
            fork_from: fork_from.map(|name| ForkFrom { name: name.into() }),
            ..serde_json::from_value(serde_json::json!({})).unwrap()
        },
    );
    executor.metadata = ObjectMeta {
        name: Some(name.into()),
        namespace: Some("team-a".into()),
        uid: Some(uid.into()),
        ..Default::default()
    };
    executor
}

fn with_status(mut executor: BriqExecutor, status: BriqExecutorStatus) -> BriqExecutor {
    executor.status = Some(status);
    executor
}

fn snapshot(id: &str, forks: &[&str]) -> Snapshot {
    Snapshot {
        parts: SnapshotParts {
            id: id.into(),
            parts: 1,
            size: 10,
            sha256: "0".repeat(64),
        },
        saved_names: 2,
        forks: forks.iter().map(|f| f.to_string()).collect(),
        ..Default::default()
    }
}

fn source_with(snapshot: Option<Snapshot>) -> BriqExecutor {
    with_status(
        executor("src", "uid-src", None),
        BriqExecutorStatus {
            snapshot,
            ..status(&ready(), Some("bq_src"))
        },
    )
}

fn all(executors: &[BriqExecutor]) -> Vec<Arc<BriqExecutor>> {
    executors.iter().cloned().map(Arc::new).collect()
}

/// `fork` as it stands once admitted and asking its source for a snapshot.
fn asking(fork: BriqExecutor) -> BriqExecutor {
    let waiting = crate::controller::executor::status::state(
        "False",
        false,
        ExecutorReason::WaitingForSnapshot,
        "",
    );
    with_status(fork, status(&waiting, None))
}

#[test]
fn forks_wait_until_a_snapshot_names_them_and_only_admitted_forks_of_this_source_count() {
    let a = asking(executor("a", "uid-a", Some("src")));
    let b = asking(executor("b", "uid-b", Some("src")));
    let other = asking(executor("c", "uid-c", Some("elsewhere")));
    let mut foreign = asking(executor("d", "uid-d", Some("src")));
    foreign.metadata.namespace = Some("team-b".into());
    let mut deleting = asking(executor("e", "uid-e", Some("src")));
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    let mut recorded = asking(executor("f", "uid-f", Some("src")));
    recorded.status.as_mut().unwrap().fork = Some(ForkOrigin::default());
    let unadmitted = executor("g", "uid-g", Some("src"));
    let waiting_for_a_place = with_status(
        executor("h", "uid-h", Some("src")),
        status(
            &crate::controller::executor::status::state(
                "False",
                false,
                ExecutorReason::WaitingForCapacity,
                "",
            ),
            None,
        ),
    );
    let everyone = all(&[
        a,
        b,
        other,
        foreign,
        deleting,
        recorded,
        unadmitted,
        waiting_for_a_place,
    ]);
    assert_eq!(waiting(&source_with(None), &everyone), ["uid-a", "uid-b"]);
    let served_a = source_with(Some(snapshot("s1", &["uid-a"])));
    assert_eq!(waiting(&served_a, &everyone), ["uid-b"]);
    assert_eq!(waiting(&source_with(None), &all(&[])), Vec::<String>::new());
}

#[test]
fn a_fork_reads_its_snapshot_until_it_records_the_restore() {
    let source = source_with(Some(snapshot("s1", &["uid-a"])));
    let unrecorded = executor("a", "uid-a", Some("src"));
    assert!(reading(&source, &all(std::slice::from_ref(&unrecorded))));
    let origin = ForkOrigin {
        snapshot: snapshot("s1", &[]).parts,
        ..Default::default()
    };
    let loading = with_status(
        unrecorded.clone(),
        BriqExecutorStatus {
            fork: Some(origin.clone()),
            ..Default::default()
        },
    );
    assert!(reading(&source, &all(&[loading])));
    let restored = with_status(
        unrecorded.clone(),
        BriqExecutorStatus {
            fork: Some(ForkOrigin {
                restored_time: Some(Time(Timestamp::now())),
                ..origin
            }),
            ..Default::default()
        },
    );
    assert!(!reading(&source, &all(&[restored])));
    assert!(!reading(&source_with(None), &all(&[unrecorded])));
}

#[test]
fn what_a_fork_finds_of_its_source() {
    let fork = executor("a", "uid-a", Some("src"));
    let taken = ForkOrigin {
        from: "src".into(),
        source_sandbox: "bq_src".into(),
        snapshot: snapshot("s1", &[]).parts,
        saved_names: 2,
        unsaved: vec![],
        restored_time: None,
    };
    let mut member = source_with(None);
    member
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(POOL_MEMBER_ANNOTATION.into(), "pool".into());
    let mut claimer = source_with(None);
    claimer.spec.pool_ref = Some(serde_json::from_value(serde_json::json!({"name": "p"})).unwrap());
    let mut other_class = source_with(None);
    other_class.spec.class_name = Some("gold".into());
    let mut unusable = source_with(None);
    unusable.status.as_mut().unwrap().unusable = true;
    let failed = source_with(Some(Snapshot {
        failure: Some("busy".into()),
        ..snapshot("s1", &["uid-a"])
    }));
    let cases: Vec<(&str, Option<BriqExecutor>, ForkSource)> = vec![
        ("missing", None, ForkSource::Missing),
        (
            "no snapshot yet",
            Some(source_with(None)),
            ForkSource::Waiting,
        ),
        (
            "a snapshot for others",
            Some(source_with(Some(snapshot("s1", &["uid-b"])))),
            ForkSource::Waiting,
        ),
        (
            "a snapshot for it",
            Some(source_with(Some(snapshot("s1", &["uid-b", "uid-a"])))),
            ForkSource::Taken(taken),
        ),
        (
            "a failed snapshot for it",
            Some(failed),
            ForkSource::Failed("src could not save a snapshot for its forks: busy".into()),
        ),
    ];
    for (name, source, expected) in cases {
        assert_eq!(source_for(&fork, source.as_ref()), expected, "{name}");
    }
    let itself = executor("src", "uid-src", Some("src"));
    assert_eq!(
        source_for(&itself, Some(&itself)),
        ForkSource::Refused("an executor cannot fork itself".into())
    );
    for (name, refused) in [
        ("pool member", member),
        ("claimer", claimer),
        ("another class", other_class),
        ("unusable", unusable),
    ] {
        assert!(
            matches!(source_for(&fork, Some(&refused)), ForkSource::Refused(_)),
            "{name}"
        );
    }
    assert_eq!(
        asked(&executor("x", "uid-x", None), &[]),
        None,
        "not a fork"
    );
    let recorded = with_status(
        fork.clone(),
        BriqExecutorStatus {
            fork: Some(ForkOrigin::default()),
            ..Default::default()
        },
    );
    assert_eq!(asked(&recorded, &[]), None, "its origin is recorded");
    assert_eq!(asked(&fork, &[]), Some(ForkSource::Missing));
}

#[test]
fn decide_table_for_forks() {
    let none = annotations(&[]);
    let origin = ForkOrigin {
        from: "src".into(),
        ..Default::default()
    };
    let fork_asked = |source: ForkSource| Asked {
        fork: Some(source),
        ..Asked::default()
    };
    let sources_asked = |waiting: bool, reading: bool, suspend: bool| Asked {
        forks_waiting: waiting,
        forks_reading: reading,
        suspend,
        ..Asked::default()
    };
    let forking = status(
        &crate::controller::executor::status::state("False", false, ExecutorReason::Forking, ""),
        Some("bq_1"),
    );
    let suspended = status(
        &crate::controller::executor::status::state("False", false, ExecutorReason::Suspended, ""),
        Some("bq_1"),
    );
    let started_for_forks = BriqExecutorStatus {
        snapshot: Some(Snapshot {
            sandbox_started: true,
            ..Default::default()
        }),
        ..suspended.clone()
    };
    let sandbox = || "bq_1".to_string();
    let cases: Vec<(&str, BriqExecutorStatus, Asked, Step)> = vec![
        (
            "a fork whose source is missing waits for it",
            BriqExecutorStatus::default(),
            fork_asked(ForkSource::Missing),
            Step::AwaitSnapshot {
                reason: ExecutorReason::ForkSourceNotFound,
                message: "waiting for spec.forkFrom's executor, which does not exist in this \
                          namespace"
                    .into(),
            },
        ),
        (
            "a fork whose source has not saved for it waits",
            BriqExecutorStatus::default(),
            fork_asked(ForkSource::Waiting),
            Step::AwaitSnapshot {
                reason: ExecutorReason::WaitingForSnapshot,
                message: "waiting for the source to save its namespace and working files \
                          between two of its Executions"
                    .into(),
            },
        ),
        (
            "a fork served records its origin",
            BriqExecutorStatus::default(),
            fork_asked(ForkSource::Taken(origin.clone())),
            Step::RecordFork {
                origin: origin.clone(),
            },
        ),
        (
            "a fork refused says so for good",
            BriqExecutorStatus::default(),
            fork_asked(ForkSource::Refused("pool".into())),
            Step::RefuseFork {
                reason: ExecutorReason::ForkRefused,
                message: "pool".into(),
            },
        ),
        (
            "a fork whose snapshot failed says so for good",
            BriqExecutorStatus::default(),
            fork_asked(ForkSource::Failed("busy".into())),
            Step::RefuseFork {
                reason: ExecutorReason::ForkFailed,
                message: "busy".into(),
            },
        ),
        (
            "a fork with its origin recorded creates its sandbox",
            BriqExecutorStatus {
                fork: Some(origin.clone()),
                ..Default::default()
            },
            Asked::default(),
            Step::CreateSandbox { pending: false },
        ),
        (
            "a Ready source with forks waiting saves for them",
            status(&ready(), Some("bq_1")),
            sources_asked(true, false, false),
            Step::Snapshot { sandbox: sandbox() },
        ),
        (
            "a Ready source asked to suspend suspends first",
            status(&ready(), Some("bq_1")),
            sources_asked(true, false, true),
            Step::Suspend { sandbox: sandbox() },
        ),
        (
            "a forking source finishes its snapshot whatever it is asked",
            forking.clone(),
            sources_asked(false, false, true),
            Step::Snapshot { sandbox: sandbox() },
        ),
        (
            "a suspended source with forks waiting packs its saved state",
            suspended.clone(),
            sources_asked(true, false, true),
            Step::SnapshotSuspended { sandbox: sandbox() },
        ),
        (
            "a suspended source started for forks stays up while they read",
            started_for_forks.clone(),
            sources_asked(false, true, true),
            Step::StaySuspended,
        ),
        (
            "a suspended source started for forks stops once they have read",
            started_for_forks,
            sources_asked(false, false, true),
            Step::SnapshotSuspended { sandbox: sandbox() },
        ),
        (
            "a suspended source without forks stays suspended",
            suspended,
            sources_asked(false, false, true),
            Step::StaySuspended,
        ),
    ];
    for (name, status, asked, expected) in cases {
        assert_eq!(decide(&status, &none, &asked), expected, "{name}");
    }
}

#[test]
fn a_report_that_does_not_add_up_is_a_failed_snapshot() {
    let report = ForkReport {
        ok: true,
        message: String::new(),
        snapshot: "ab".repeat(16),
        parts: 2,
        size: 10,
        sha256: "A".repeat(64),
        files: 1,
        skipped: 0,
        saved: vec!["x".into()],
        unsaved: vec![Unsaved {
            name: "sock".into(),
            why: "cannot pickle".into(),
        }],
        state_bytes: 10,
        error: None,
    };
    let bad = snapshot_of(&report, vec!["uid-a".into()], false);
    assert_eq!(
        bad.failure.as_deref(),
        Some("the bridge reported 2 parts for 10 bytes")
    );
    let good = snapshot_of(
        &ForkReport { parts: 1, ..report },
        vec!["uid-a".into()],
        true,
    );
    assert_eq!(good.failure, None);
    assert_eq!(good.parts.sha256, "a".repeat(64), "kept lowercase");
    assert_eq!((good.saved_names, good.unsaved.len()), (1, 1));
    assert!(good.sandbox_started);
    assert_eq!(good.forks, ["uid-a"]);
}
