use serde_json::{Value, json};

use super::*;

type Classes = Vec<Arc<BriqExecutorClass>>;
type ClassSlice = [Arc<BriqExecutorClass>];
type Labels = BTreeMap<String, String>;

fn spec(value: Value) -> BriqExecutorSpec {
    serde_json::from_value(value).unwrap()
}

fn class(name: &str, default: bool, created: &str, spec: Value) -> Arc<BriqExecutorClass> {
    let mut value = json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutorClass",
        "metadata": { "name": name, "creationTimestamp": created },
        "spec": spec,
    });
    if default {
        value["metadata"]["annotations"] = json!({ "briq.cloud/is-default-class": "true" });
    }
    Arc::new(serde_json::from_value(value).unwrap())
}

fn key() -> Value {
    json!({ "apiKeySecretRef": { "name": "briq-key" } })
}

fn rules(extra: Value) -> BriqExecutorClassSpec {
    let mut value = key();
    for (field, v) in extra.as_object().unwrap() {
        value[field] = v.clone();
    }
    serde_json::from_value(value).unwrap()
}

fn resolved_name(resolved: Resolved) -> String {
    match resolved {
        Resolved::Class(class) => format!("class {}", class.name_any()),
        Resolved::Missing(name) => format!("missing {name}"),
        Resolved::Unclassed => "unclassed".into(),
    }
}

#[test]
fn the_class_an_executor_takes() {
    let standard = class("standard", true, "2026-01-01T00:00:00Z", key());
    let mut team_only = key();
    team_only["namespaceSelector"] =
        json!({ "matchLabels": { "kubernetes.io/metadata.name": "team-a" } });
    let team_default = class("team", true, "2026-03-01T00:00:00Z", team_only);
    let newer_default = class("newer", true, "2026-02-01T00:00:00Z", key());
    let premium = class("premium", false, "2026-01-01T00:00:00Z", key());
    let all = vec![standard.clone(), premium.clone()];
    let two_defaults = vec![standard.clone(), premium.clone(), newer_default];
    let scoped_default = vec![standard, premium, team_default];
    let own_key = json!({ "apiKeySecretRef": { "name": "mine" } });
    use Recorded::{Class, NotYet, Unclassed};
    let cases: Vec<(&str, Value, Recorded, &ClassSlice, &str)> = vec![
        (
            "made before classes existed: unclassed",
            json!({}),
            Unclassed,
            &all,
            "unclassed",
        ),
        (
            "names one",
            json!({ "className": "premium" }),
            NotYet,
            &all,
            "class premium",
        ),
        (
            "names one not made yet",
            json!({ "className": "gold" }),
            NotYet,
            &all,
            "missing gold",
        ),
        (
            "names none: the default",
            json!({}),
            NotYet,
            &all,
            "class standard",
        ),
        (
            "names none, several defaults: the newest",
            json!({}),
            NotYet,
            &two_defaults,
            "class newer",
        ),
        (
            "names none, no default: unclassed",
            json!({}),
            NotYet,
            &[],
            "unclassed",
        ),
        (
            "names none, the newest default is for team-a only: the other",
            json!({}),
            NotYet,
            &scoped_default,
            "class standard",
        ),
        (
            "brings its own key",
            own_key.clone(),
            NotYet,
            &all,
            "unclassed",
        ),
        (
            "own key, even when recorded",
            own_key,
            Class("premium"),
            &all,
            "unclassed",
        ),
        (
            "made under a former default",
            json!({}),
            Class("premium"),
            &all,
            "class premium",
        ),
        (
            "made under a class since deleted",
            json!({}),
            Class("old"),
            &all,
            "missing old",
        ),
        (
            "the name wins over the record",
            json!({ "className": "premium" }),
            Class("standard"),
            &all,
            "class premium",
        ),
    ];
    let labels = BTreeMap::from([(
        "kubernetes.io/metadata.name".to_owned(),
        "team-b".to_owned(),
    )]);
    for (case, executor, recorded, classes, expected) in cases {
        let got = resolved_name(resolve(&spec(executor), recorded, classes, &labels));
        assert_eq!(got, expected, "{case}");
    }
}

#[test]
fn a_field_left_at_its_default_takes_the_classs() {
    let class = rules(json!({
        "defaultImage": "corp/python:3.12", "defaultSize": "small", "defaultSleep": "2h",
        "maxExecutionTimeoutSeconds": 20, "defaultIdleTimeoutSeconds": 600,
        "maxIdleTimeoutSeconds": 3600,
    }));
    let cases = [
        (
            "all left at their defaults",
            json!({}),
            Effective {
                image: "corp/python:3.12".into(),
                size: Some("small".into()),
                sleep: "2h".into(),
                execution_timeout_seconds: 20,
                idle_timeout_seconds: Some(600),
            },
        ),
        (
            "all set",
            json!({
                "image": "corp/ml:1", "size": "large", "sleep": "10m",
                "executionTimeoutSeconds": 10, "idleTimeoutSeconds": 60,
            }),
            Effective {
                image: "corp/ml:1".into(),
                size: Some("large".into()),
                sleep: "10m".into(),
                execution_timeout_seconds: 10,
                idle_timeout_seconds: Some(60),
            },
        ),
        (
            "a timeout set above the maximum stays (and is refused)",
            json!({ "executionTimeoutSeconds": 40 }),
            Effective {
                image: "corp/python:3.12".into(),
                size: Some("small".into()),
                sleep: "2h".into(),
                execution_timeout_seconds: 40,
                idle_timeout_seconds: Some(600),
            },
        ),
    ];
    for (case, executor, expected) in cases {
        assert_eq!(effective(&spec(executor), Some(&class)), expected, "{case}");
    }
    let only_max = rules(json!({ "maxIdleTimeoutSeconds": 3600 }));
    assert_eq!(
        effective(&spec(json!({})), Some(&only_max)).idle_timeout_seconds,
        Some(3600),
        "no idle timeout and no default: the class's maximum"
    );
    assert_eq!(
        effective(&spec(json!({})), None),
        Effective {
            image: "python:3.12-slim".into(),
            size: None,
            sleep: "30m".into(),
            execution_timeout_seconds: 30,
            idle_timeout_seconds: None,
        },
        "no class: the spec as it is"
    );
}

#[test]
fn each_broken_limit_is_named() {
    let strict = rules(json!({
        "namespaceSelector": { "matchLabels": { "briq.cloud/tenant": "true" } },
        "allowedImages": ["corp/python:3.12", "registry.example.com/agents/*"],
        "defaultImage": "corp/python:3.12",
        "allowedSizes": ["small", "medium"],
        "maxExecutionTimeoutSeconds": 20,
        "maxIdleTimeoutSeconds": 3600,
    }));
    let tenant = BTreeMap::from([
        (
            "kubernetes.io/metadata.name".to_owned(),
            "team-a".to_owned(),
        ),
        ("briq.cloud/tenant".to_owned(), "true".to_owned()),
    ]);
    let outsider = BTreeMap::from([(
        "kubernetes.io/metadata.name".to_owned(),
        "team-x".to_owned(),
    )]);
    let cases: Vec<(&str, Value, &Labels, Vec<&str>)> = vec![
        ("defaults only", json!({}), &tenant, vec![]),
        (
            "an image under an allowed prefix",
            json!({ "image": "registry.example.com/agents/pandas:2" }),
            &tenant,
            vec![],
        ),
        (
            "an image outside",
            json!({ "image": "evil/miner:latest" }),
            &tenant,
            vec![
                "image evil/miner:latest is not allowed by class strict (allowedImages: corp/python:3.12, registry.example.com/agents/*)",
            ],
        ),
        (
            "the prefix is not a substring match",
            json!({ "image": "registry.example.com/agentsX/a:1" }),
            &tenant,
            vec![
                "image registry.example.com/agentsX/a:1 is not allowed by class strict (allowedImages: corp/python:3.12, registry.example.com/agents/*)",
            ],
        ),
        (
            "a size outside",
            json!({ "size": "xlarge" }),
            &tenant,
            vec!["size xlarge is not allowed by class strict (allowedSizes: small, medium)"],
        ),
        (
            "a timeout above the maximum",
            json!({ "executionTimeoutSeconds": 40 }),
            &tenant,
            vec![
                "executionTimeoutSeconds 40 is above class strict's maxExecutionTimeoutSeconds 20",
            ],
        ),
        (
            "an idle timeout above the maximum",
            json!({ "idleTimeoutSeconds": 7200 }),
            &tenant,
            vec!["idleTimeoutSeconds 7200 is above class strict's maxIdleTimeoutSeconds 3600"],
        ),
        (
            "suspending when idle, which the class does not allow",
            json!({ "idleAction": "Suspend" }),
            &tenant,
            vec!["idleAction Suspend is not allowed by class strict (allowIdleSuspend is not set)"],
        ),
        (
            "expiring when idle, said explicitly",
            json!({ "idleAction": "Expire" }),
            &tenant,
            vec![],
        ),
        (
            "a namespace outside the selector, among others",
            json!({ "size": "xlarge" }),
            &outsider,
            vec![
                "namespace team-x may not use class strict: its namespaceSelector does not select it",
                "size xlarge is not allowed by class strict (allowedSizes: small, medium)",
            ],
        ),
    ];
    for (case, executor, labels, expected) in cases {
        let namespace = &labels["kubernetes.io/metadata.name"];
        let got = violations("strict", &strict, &spec(executor), namespace, labels);
        assert_eq!(got, expected, "{case}");
    }
    let open = rules(json!({ "allowIdleSuspend": true }));
    assert!(
        violations(
            "open",
            &open,
            &spec(json!({ "image": "any:1", "size": "huge", "idleAction": "Suspend" })),
            "x",
            &outsider
        )
        .is_empty(),
        "a class without limits allows anything, in any namespace"
    );
}

#[test]
fn a_pool_beyond_the_class_maximum_is_named() {
    let class = rules(json!({ "maxPoolReplicas": 10 }));
    assert_eq!(pool_violation("c", &class, "replicas", 10), None);
    assert_eq!(
        pool_violation("c", &class, "replicas", 11).as_deref(),
        Some("replicas 11 is above class c's maxPoolReplicas 10")
    );
    assert_eq!(
        pool_violation("c", &rules(json!({})), "replicas", 1000),
        None
    );
}

#[test]
fn what_the_annotations_record_of_the_class() {
    let of = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let cases = [
        ("nothing made", of(&[]), Recorded::NotYet),
        (
            "a create marked pending under a class",
            of(&[
                (CREATE_PENDING_ANNOTATION, "t op"),
                (CLASS_ANNOTATION, "std"),
            ]),
            Recorded::Class("std"),
        ),
        (
            "a sandbox made before classes",
            of(&[(SANDBOX_ID_ANNOTATION, "bq_1")]),
            Recorded::Unclassed,
        ),
        (
            "a create marked pending before classes",
            of(&[(CREATE_PENDING_ANNOTATION, "t")]),
            Recorded::Unclassed,
        ),
        (
            "a member claimed before classes",
            of(&[(CLAIMED_MEMBER_ANNOTATION, "m1")]),
            Recorded::Unclassed,
        ),
    ];
    for (case, annotations, expected) in &cases {
        assert_eq!(recorded(annotations), *expected, "{case}");
    }
}

#[test]
fn the_namespace_is_read_only_when_its_labels_can_matter() {
    let open_default = class("open", true, "2026-01-01T00:00:00Z", key());
    let mut selective = key();
    selective["namespaceSelector"] = json!({ "matchLabels": { "tier": "gold" } });
    let scoped = class("scoped", false, "2026-01-01T00:00:00Z", selective.clone());
    let scoped_default = class("scoped-default", true, "2026-01-01T00:00:00Z", selective);
    let cases: Vec<(&str, Value, Recorded, Classes, bool)> = vec![
        ("no classes", json!({}), Recorded::NotYet, vec![], false),
        (
            "names a class without selector",
            json!({ "className": "open" }),
            Recorded::NotYet,
            vec![open_default.clone()],
            false,
        ),
        (
            "names a class with a selector",
            json!({ "className": "scoped" }),
            Recorded::NotYet,
            vec![scoped.clone()],
            true,
        ),
        (
            "takes the default without selector",
            json!({}),
            Recorded::NotYet,
            vec![open_default.clone()],
            false,
        ),
        (
            "a default that selects",
            json!({}),
            Recorded::NotYet,
            vec![scoped_default.clone()],
            true,
        ),
        (
            "made already, unclassed",
            json!({}),
            Recorded::Unclassed,
            vec![scoped_default],
            false,
        ),
        (
            "its own key",
            json!({ "apiKeySecretRef": { "name": "k" } }),
            Recorded::NotYet,
            vec![scoped],
            false,
        ),
    ];
    for (case, executor, recorded, classes, expected) in cases {
        assert_eq!(
            needs_namespace_labels(&spec(executor), recorded, &classes),
            expected,
            "{case}"
        );
    }
}

#[test]
fn an_idle_timeout_raised_after_admission_runs_within_the_class_maximum() {
    let class = rules(json!({ "maxIdleTimeoutSeconds": 3600 }));
    let raised = spec(json!({ "idleTimeoutSeconds": 90000 }));
    assert_eq!(idle_timeout_seconds(&raised, Some(&class)), Some(3600));
    assert_eq!(idle_timeout_seconds(&raised, None), Some(90000));
    assert_eq!(
        idle_timeout_seconds(&spec(json!({})), Some(&class)),
        Some(3600)
    );
}

#[test]
fn executors_wait_for_a_place_oldest_first() {
    let holds = Holder {
        holds: true,
        waits_since: None,
    };
    let waiting = |at: &str, name: &str| Holder {
        holds: false,
        waits_since: Some((at.to_owned(), name.to_owned())),
    };
    let gone = Holder {
        holds: false,
        waits_since: None,
    };
    let others = [
        holds.clone(),
        holds,
        gone,
        waiting("2026-01-01T00:00:01Z", "b"),
        waiting("2026-01-01T00:00:02Z", "a"),
    ];
    // With a maximum of 3: the one created first of those waiting may go on (2 + 0 < 3).
    assert_eq!(executors_ahead(&others, "2026-01-01T00:00:01Z", "a"), 2);
    assert_eq!(executors_ahead(&others, "2026-01-01T00:00:01Z", "c"), 3);
    assert_eq!(executors_ahead(&others, "2026-01-01T00:00:03Z", "z"), 4);
}

#[test]
fn an_executor_suspends_when_idle_only_if_it_asks_and_its_class_allows() {
    let allows = rules(json!({ "allowIdleSuspend": true }));
    let forbids = rules(json!({}));
    let suspends = spec(json!({ "idleAction": "Suspend" }));
    let expires = spec(json!({}));
    let cases = [
        ("asks, no class", &suspends, None, true),
        ("asks, the class allows", &suspends, Some(&allows), true),
        (
            "asks, the class does not allow (changed after admission)",
            &suspends,
            Some(&forbids),
            false,
        ),
        ("does not ask", &expires, Some(&allows), false),
    ];
    for (case, spec, class, suspends) in cases {
        assert_eq!(suspends_when_idle(spec, class), suspends, "{case}");
    }
}
