//! What an executor's create learns of its class's briq key, said on the class: its
//! `BriqInterface` condition goes False when briq's MCP server does not match what the operator
//! sends with the key, and back to True when a sandbox is made with it again. Written only when
//! it changes: a class shared by many executors is not written once per executor.

use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::warn;

use super::actor::Actor;
use crate::{
    briq::SandboxApi,
    controller::status::apply_status,
    crd::{
        BriqExecutorClass, EXECUTOR_MANAGER,
        conditions::{self, BRIQ_INTERFACE, Desired, desired},
        reasons::ClassReason,
    },
};

/// What a create found of the class's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Interface {
    /// A sandbox was made with it.
    Matches,
    /// The server's interface differs; the mismatches, described.
    Mismatch(String),
}

/// The class's `BriqInterface` condition to write after `found`, given its `current` ones;
/// `None` when it says that already (a match is written only over a mismatch).
pub(super) fn interface_update(
    current: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    found: &Interface,
) -> Option<Desired> {
    let now = conditions::find(current, BRIQ_INTERFACE);
    let wanted = match found {
        Interface::Mismatch(message) => desired(
            BRIQ_INTERFACE,
            "False",
            ClassReason::BriqInterfaceMismatch.as_str(),
            message.clone(),
        ),
        Interface::Matches => desired(
            BRIQ_INTERFACE,
            "True",
            ClassReason::InterfaceMatches.as_str(),
            "briq's MCP server declares every tool and argument the operator sends",
        ),
    };
    let says_it = now.is_some_and(|c| {
        c.status == wanted.status && c.reason == wanted.reason && c.message == wanted.message
    });
    let clears_a_mismatch = now.is_some_and(|c| c.status == "False");
    match found {
        _ if says_it => None,
        Interface::Matches if !clears_a_mismatch => None,
        _ => Some(wanted),
    }
}

impl<S: SandboxApi> Actor<'_, S> {
    /// Says on `class` what a create found of its key, when its status does not say it yet. A
    /// failed write is logged, never the create's failure: the executor's own status says it.
    pub(super) async fn report_class_interface(&self, class: &BriqExecutorClass, found: Interface) {
        let current = class
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        let Some(update) = interface_update(current, &found) else {
            return;
        };
        let merged = conditions::merge(current, &[update], class.metadata.generation);
        let api: Api<BriqExecutorClass> = Api::all(self.shared.client.clone());
        let status = json!({ "conditions": merged });
        if let Err(error) = apply_status(&api, class, EXECUTOR_MANAGER, status).await {
            warn!(class = %class.name_any(), %error, "writing the class's BriqInterface condition failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    use super::*;

    fn condition(status: &str, reason: ClassReason, message: &str) -> Condition {
        Condition {
            type_: BRIQ_INTERFACE.to_owned(),
            status: status.to_owned(),
            reason: reason.as_str().to_owned(),
            message: message.to_owned(),
            observed_generation: Some(1),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }
    }

    #[test]
    fn the_class_is_written_only_when_what_it_says_changes() {
        let mismatch = Interface::Mismatch("briq_exec.stdin: sent, but not declared".into());
        let other = Interface::Mismatch("briq_status: the server declares no such tool".into());
        let said = condition(
            "False",
            ClassReason::BriqInterfaceMismatch,
            "briq_exec.stdin: sent, but not declared",
        );
        let matched = condition(
            "True",
            ClassReason::InterfaceMatches,
            "briq's MCP server declares every tool and argument the operator sends",
        );
        type Case<'a> = (
            Vec<Condition>,
            &'a Interface,
            Option<(&'a str, ClassReason)>,
        );
        let cases: Vec<Case> = vec![
            // A first mismatch is said; said again, it is not written again.
            (
                vec![],
                &mismatch,
                Some(("False", ClassReason::BriqInterfaceMismatch)),
            ),
            (vec![said.clone()], &mismatch, None),
            // Another mismatch replaces the message.
            (
                vec![said.clone()],
                &other,
                Some(("False", ClassReason::BriqInterfaceMismatch)),
            ),
            // A match clears a mismatch, and is never written on a class that had none.
            (
                vec![said],
                &Interface::Matches,
                Some(("True", ClassReason::InterfaceMatches)),
            ),
            (vec![], &Interface::Matches, None),
            (vec![matched.clone()], &Interface::Matches, None),
            (
                vec![matched],
                &mismatch,
                Some(("False", ClassReason::BriqInterfaceMismatch)),
            ),
        ];
        for (current, found, expected) in cases {
            let update = interface_update(&current, found);
            assert_eq!(
                update.as_ref().map(|d| (d.status, d.reason)),
                expected.map(|(status, reason)| (status, reason.as_str())),
                "{current:?} {found:?}"
            );
        }
    }
}
