//! What a `BriqExecutorPool` needs next, decided from its members as the cache shows them: pure
//! functions, tested with exact expected outputs. The reconciler ([`super`]) observes and acts.

use kube::ResourceExt;

use crate::{
    controller::{
        class::{self, Resolved},
        index::Member,
    },
    crd::{
        conditions::{Desired, READY, desired},
        reasons::PoolReason,
    },
};

/// What the pool does now, and what its status says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Members to make from the current template.
    pub create: usize,
    /// Members to delete (their finalizer destroys their sandbox): broken, outdated, surplus.
    pub delete: Vec<String>,
    /// Members from the current template kept (`status.replicas`), and how many are Ready.
    pub replicas: i32,
    pub ready_replicas: i32,
}

/// Keeps `desired` healthy members from the current template: broken and outdated ones go (a
/// claimed member is not a member any more, so a template change never touches what a claimer
/// holds); a surplus goes not-ready first, then newest first, so the warmest stay.
pub fn plan(desired: i32, members: &[Member]) -> Plan {
    let desired = usize::try_from(desired).unwrap_or(0);
    let mut delete = Vec::new();
    let mut healthy: Vec<&Member> = Vec::new();
    for member in members.iter().filter(|m| !m.deleting) {
        if member.broken || !member.current {
            delete.push(member.name.clone());
        } else {
            healthy.push(member);
        }
    }
    if healthy.len() > desired {
        // Keep order: ready before not ready, then oldest first.
        healthy.sort_by(|a, b| {
            b.ready
                .cmp(&a.ready)
                .then(a.created.cmp(&b.created))
                .then(a.name.cmp(&b.name))
        });
        // Least wanted first.
        delete.extend(healthy.drain(desired..).rev().map(|m| m.name.clone()));
    }
    let kept = healthy.len();
    Plan {
        create: desired - kept,
        delete,
        replicas: kept as i32,
        ready_replicas: healthy.iter().filter(|m| m.ready).count() as i32,
    }
}

/// How many members a pool keeps, from its replicas and its class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Size {
    /// `desired` members; `capped` names the class limit that holds them below the replicas
    /// (the scale subresource passes no admission check of the class).
    Keep {
        desired: i32,
        capped: Option<String>,
    },
    /// The template names a class that does not exist (yet): members are neither made (their
    /// number could break a limit the class sets) nor removed.
    ClassMissing(String),
}

/// Where the number of members a pool asks for comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// Its `replicas` (or the scale subresource's).
    Replicas,
    /// Its demand target, between `minReady` and `maxReady`.
    Demand,
}

impl Asked {
    /// The number's name in a condition's message.
    fn field(self) -> &'static str {
        match self {
            Asked::Replicas => "replicas",
            Asked::Demand => "the demand target",
        }
    }
}

/// The size of a pool asking for `replicas` members (`asked` says how) under `class`, its
/// template's class.
pub fn size(replicas: i32, asked: Asked, class: &Resolved) -> Size {
    match class {
        Resolved::Class(made_under) => {
            let name = made_under.name_any();
            match class::pool_violation(&name, &made_under.spec, asked.field(), replicas) {
                Some(broken) => Size::Keep {
                    desired: made_under.spec.max_pool_replicas.unwrap_or(0),
                    capped: Some(broken),
                },
                None => Size::Keep {
                    desired: replicas,
                    capped: None,
                },
            }
        }
        Resolved::Missing(name) => Size::ClassMissing(name.clone()),
        Resolved::Unclassed => Size::Keep {
            desired: replicas,
            capped: None,
        },
    }
}

/// The pool's `Ready` condition while its template's class `name` does not exist.
pub fn class_missing_condition(name: &str) -> Desired {
    desired_condition(
        "False",
        PoolReason::ClassNotFound,
        format!(
            "the template names BriqExecutorClass {name}, which does not exist; no member is made \
             or removed until it does"
        ),
    )
}

/// The pool's `Ready` condition.
pub fn ready_condition(desired: i32, ready: i32) -> Desired {
    if ready >= desired {
        desired_condition(
            "True",
            PoolReason::MembersReady,
            format!("{ready} of {desired} members are Ready"),
        )
    } else {
        desired_condition(
            "False",
            PoolReason::Filling,
            format!("{ready} of {desired} members are Ready"),
        )
    }
}

fn desired_condition(status: &'static str, reason: PoolReason, message: String) -> Desired {
    desired(READY, status, reason.as_str(), message)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn member(name: &str, ready: bool, created: i64) -> Member {
        Member {
            name: name.into(),
            current: true,
            ready,
            broken: false,
            deleting: false,
            created: Some(Timestamp::from_second(1_800_000_000 + created).unwrap()),
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn class(name: &str, spec: serde_json::Value) -> Resolved {
        let class = serde_json::json!({
            "apiVersion": "briq.cloud/v1alpha1",
            "kind": "BriqExecutorClass",
            "metadata": { "name": name },
            "spec": spec,
        });
        Resolved::Class(std::sync::Arc::new(serde_json::from_value(class).unwrap()))
    }

    #[test]
    fn size_table() {
        let key = serde_json::json!({ "apiKeySecretRef": { "name": "k" } });
        let mut capped = key.clone();
        capped["maxPoolReplicas"] = 2.into();
        let cases = [
            (
                "no class: its replicas",
                5,
                Asked::Replicas,
                Resolved::Unclassed,
                Size::Keep {
                    desired: 5,
                    capped: None,
                },
            ),
            (
                "a class without a pool limit: its replicas",
                5,
                Asked::Replicas,
                class("std", key),
                Size::Keep {
                    desired: 5,
                    capped: None,
                },
            ),
            (
                "within the class's maximum",
                2,
                Asked::Demand,
                class("small", capped.clone()),
                Size::Keep {
                    desired: 2,
                    capped: None,
                },
            ),
            (
                "above the class's maximum: the maximum",
                3,
                Asked::Replicas,
                class("small", capped.clone()),
                Size::Keep {
                    desired: 2,
                    capped: Some("replicas 3 is above class small's maxPoolReplicas 2".into()),
                },
            ),
            (
                "a demand target above the class's maximum: the maximum, named as the target",
                4,
                Asked::Demand,
                class("small", capped),
                Size::Keep {
                    desired: 2,
                    capped: Some(
                        "the demand target 4 is above class small's maxPoolReplicas 2".into(),
                    ),
                },
            ),
            (
                "a class not there (yet): nothing made or removed",
                3,
                Asked::Replicas,
                Resolved::Missing("later".into()),
                Size::ClassMissing("later".into()),
            ),
        ];
        for (name, replicas, asked, resolved, expected) in cases {
            assert_eq!(size(replicas, asked, &resolved), expected, "{name}");
        }
    }

    #[test]
    fn plan_table() {
        let outdated = Member {
            current: false,
            ..member("old", true, 0)
        };
        let broken = Member {
            broken: true,
            ..member("sick", true, 1)
        };
        let deleting = Member {
            deleting: true,
            ..member("going", true, 2)
        };
        let cases = [
            ("empty pool fills", 3, vec![], 3, vec![], 0, 0),
            (
                "full and ready: nothing to do",
                2,
                vec![member("a", true, 0), member("b", true, 1)],
                0,
                vec![],
                2,
                2,
            ),
            (
                "outdated members are replaced",
                2,
                vec![outdated.clone(), member("a", true, 1)],
                1,
                vec!["old"],
                1,
                1,
            ),
            (
                "broken members are replaced",
                2,
                vec![broken, member("a", false, 1)],
                1,
                vec!["sick"],
                1,
                0,
            ),
            (
                "members being deleted neither count nor go twice",
                1,
                vec![deleting],
                1,
                vec![],
                0,
                0,
            ),
            (
                "scale down: not-ready first, then the newest",
                1,
                vec![
                    member("a", true, 0),
                    member("b", false, 1),
                    member("c", true, 2),
                ],
                0,
                vec!["b", "c"],
                1,
                1,
            ),
            (
                "scale to zero deletes every member",
                0,
                vec![member("a", true, 0), outdated],
                0,
                vec!["old", "a"],
                0,
                0,
            ),
            (
                "negative replicas read as zero",
                -1,
                vec![],
                0,
                vec![],
                0,
                0,
            ),
        ];
        for (name, desired, members, create, delete, replicas, ready) in cases {
            assert_eq!(
                plan(desired, &members),
                Plan {
                    create,
                    delete: names(&delete),
                    replicas,
                    ready_replicas: ready,
                },
                "{name}"
            );
        }
    }

    #[test]
    fn the_pool_is_ready_when_every_wanted_member_is() {
        let table = [
            (2, 2, "True"),
            (2, 3, "True"),
            (2, 1, "False"),
            (0, 0, "True"),
        ];
        for (desired, ready, status) in table {
            assert_eq!(
                ready_condition(desired, ready).status,
                status,
                "{desired}/{ready}"
            );
        }
    }
}
