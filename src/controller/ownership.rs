//! Whose a sandbox is. Every id the operator records (annotations, status) is tenant-writable, so
//! before it adopts, runs code in or destroys a sandbox it asks briq, and only briq's answer
//! counts: the sandbox is an executor's when its name is that executor's deterministic name.

use kube::{
    Api, ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};

use crate::{
    briq::{self, ErrorClass},
    crd::BriqExecutor,
};

/// Whose a sandbox named in a tenant-writable field (annotation, status) is. Only briq's own
/// answer decides: the sandbox is this executor's when its name is this executor's
/// deterministic name (namespace, name and uid).
#[derive(Debug, PartialEq, Eq)]
pub enum Ownership {
    Owned,
    /// Another object's sandbox (or one nobody made for an executor): never touched.
    Foreign,
    Gone,
}

/// `None`: briq did not say (ask again later).
pub fn ownership(
    expected_name: &str,
    found: &Result<briq::Sandbox, briq::Error>,
) -> Option<Ownership> {
    match found {
        Ok(sandbox) if sandbox.name == expected_name => Some(Ownership::Owned),
        Ok(_) => Some(Ownership::Foreign),
        Err(error) if error.class() == ErrorClass::NotFound => Some(Ownership::Gone),
        Err(_) => None,
    }
}

/// Why an executor refuses the sandbox a field of it names.
pub fn not_owned_message(id: &str) -> String {
    format!(
        "sandbox {id}, named in this executor's annotations or status, belongs to another \
         object: it is never used or destroyed by this executor"
    )
}

/// The name briq must show for `executor`'s sandbox: its own deterministic name, or, for a
/// claimer, that of the pool member whose sandbox it took, but only when that member (found
/// through the claimer's `claimed-member` pointer, in the same namespace) says it was handed to
/// this very executor (its uid). A copied or restored claimer has another uid: the member's
/// sandbox is then foreign to it.
pub fn expected_sandbox_name(executor: &BriqExecutor, member: Option<&BriqExecutor>) -> String {
    let uid = executor.uid().unwrap_or_default();
    let namespace = executor.namespace().unwrap_or_default();
    let handed_to_this_executor = |member: &&BriqExecutor| {
        !uid.is_empty()
            && member.namespace().as_deref() == Some(namespace.as_str())
            && member.claimed_by() == Some(uid.as_str())
    };
    match member.filter(handed_to_this_executor) {
        Some(member) => briq::sandbox_name(
            &namespace,
            &member.name_any(),
            &member.uid().unwrap_or_default(),
        ),
        None => briq::sandbox_name(&namespace, &executor.name_any(), &uid),
    }
}

/// The member a claimer points at ([`BriqExecutor::claimed_member`]), from the cache or, when the cache does
/// not show it handed to this claimer yet, read fresh.
pub async fn claimed_member(
    executor: &BriqExecutor,
    executors: &Store<BriqExecutor>,
    client: &kube::Client,
) -> Result<Option<BriqExecutor>, kube::Error> {
    let Some(name) = executor.claimed_member() else {
        return Ok(None);
    };
    let namespace = executor.namespace().unwrap_or_default();
    let cached = executors.get(&ObjectRef::new(name).within(&namespace));
    if let Some(member) = &cached
        && member.claimed_by() == executor.uid().as_deref()
    {
        return Ok(Some(member.as_ref().clone()));
    }
    Api::<BriqExecutor>::namespaced(client.clone(), &namespace)
        .get_opt(name)
        .await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::crd::{CLAIMED_BY_ANNOTATION, CLAIMED_MEMBER_ANNOTATION};

    fn executor(name: &str, uid: &str, annotations: serde_json::Value) -> BriqExecutor {
        serde_json::from_value(json!({
            "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
            "metadata": { "name": name, "namespace": "team", "uid": uid, "annotations": annotations },
            "spec": {},
        }))
        .unwrap()
    }

    #[test]
    fn a_claimer_owns_its_members_sandbox_only_when_the_member_names_its_uid() {
        let claimer = executor(
            "agent",
            "uid-c",
            json!({ CLAIMED_MEMBER_ANNOTATION: "fast-x" }),
        );
        let own = briq::sandbox_name("team", "agent", "uid-c");
        let members = briq::sandbox_name("team", "fast-x", "uid-m");
        let handed = executor("fast-x", "uid-m", json!({ CLAIMED_BY_ANNOTATION: "uid-c" }));
        let to_another = executor("fast-x", "uid-m", json!({ CLAIMED_BY_ANNOTATION: "uid-z" }));
        let unclaimed = executor("fast-x", "uid-m", json!({}));
        let copied_claimer = executor(
            "agent-copy",
            "uid-k",
            json!({ CLAIMED_MEMBER_ANNOTATION: "fast-x" }),
        );
        let mut elsewhere = handed.clone();
        elsewhere.metadata.namespace = Some("other".into());
        let cases = [
            ("handed to it", &claimer, Some(&handed), members.clone()),
            ("no member", &claimer, None, own.clone()),
            (
                "handed to another",
                &claimer,
                Some(&to_another),
                own.clone(),
            ),
            ("not claimed", &claimer, Some(&unclaimed), own.clone()),
            ("another namespace", &claimer, Some(&elsewhere), own.clone()),
            (
                "a copy of the claimer (another uid)",
                &copied_claimer,
                Some(&handed),
                briq::sandbox_name("team", "agent-copy", "uid-k"),
            ),
        ];
        for (name, executor, member, expected) in cases {
            assert_eq!(expected_sandbox_name(executor, member), expected, "{name}");
        }
    }
}
