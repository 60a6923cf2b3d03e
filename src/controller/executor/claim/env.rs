//! A claimer's environment (`poolRef.env`): its values, some from labelled Secrets of its
//! namespace, resolved before it takes or makes a sandbox ([`resolve`] decides what they are,
//! [`Actor::claim_env`] reads the Secrets and says in the status why it waits). The handover
//! delivers them (record.rs), and so does provisioning for a sandbox of its own
//! (provision.rs). No value is ever written to an object, an Event or a log: messages name
//! Secrets, keys and variables only.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};

use crate::controller::executor::{
    actor::Actor,
    status::{sandbox_fields, state},
};
use crate::{
    bridge::session::ClaimEnv,
    briq::SandboxApi,
    controller::context::Result,
    crd::{
        BriqExecutor, CLAIM_ENV_LABEL, CLAIM_ENV_LABEL_VALUE, ClaimEnvVar, reasons::ExecutorReason,
    },
};

/// The most a claimer's environment may weigh, as the JSON the bridge reads.
pub const CLAIM_ENV_MAX_BYTES: usize = 65_536;

/// The Secrets `entries` take values from, by name (each once).
fn secrets_named(entries: &[ClaimEnvVar]) -> Vec<String> {
    let mut names: Vec<String> = entries
        .iter()
        .filter_map(|entry| entry.value_from.as_ref())
        .map(|from| from.secret_key_ref.name.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The environment `entries` make, given the Secrets of `namespace` they name as read (`None`:
/// missing), or why there is none. A Secret without the opt-in label counts as missing: else
/// whoever may create an executor could have any Secret of the namespace delivered into a
/// kernel whose code they write, even one they cannot read.
pub fn resolve(
    namespace: &str,
    entries: &[ClaimEnvVar],
    secrets: &BTreeMap<String, Option<Secret>>,
) -> Result<ClaimEnv, String> {
    let mut env = ClaimEnv::new();
    for entry in entries {
        let value = match (&entry.value, &entry.value_from) {
            (Some(value), None) => value.clone(),
            (None, Some(from)) => {
                let reference = &from.secret_key_ref;
                let name = &reference.name;
                let secret = secrets
                    .get(name)
                    .and_then(Option::as_ref)
                    .filter(|secret| {
                        secret.labels().get(CLAIM_ENV_LABEL).map(String::as_str)
                            == Some(CLAIM_ENV_LABEL_VALUE)
                    })
                    .ok_or_else(|| {
                        format!(
                            "no Secret {namespace}/{name} labelled \
                             {CLAIM_ENV_LABEL}={CLAIM_ENV_LABEL_VALUE} (for {})",
                            entry.name
                        )
                    })?;
                let bytes = secret
                    .data
                    .as_ref()
                    .and_then(|data| data.get(&reference.key))
                    .ok_or_else(|| {
                        format!(
                            "Secret {namespace}/{name} has no key {} (for {})",
                            reference.key, entry.name
                        )
                    })?;
                String::from_utf8(bytes.0.clone()).map_err(|_| {
                    format!(
                        "key {} of Secret {namespace}/{name} is not UTF-8 text (for {})",
                        reference.key, entry.name
                    )
                })?
            }
            // The schema allows neither; an object written before it was checked says so.
            _ => {
                return Err(format!(
                    "{} needs exactly one of value and valueFrom",
                    entry.name
                ));
            }
        };
        if value.contains('\0') {
            return Err(format!("the value of {} contains NUL", entry.name));
        }
        env.insert(entry.name.clone(), value);
    }
    let bytes = serde_json::to_string(&env).map_or(0, |json| json.len());
    if bytes > CLAIM_ENV_MAX_BYTES {
        return Err(format!(
            "the environment is {bytes} bytes, over the limit of {CLAIM_ENV_MAX_BYTES}"
        ));
    }
    Ok(env)
}

impl<S: SandboxApi> Actor<'_, S> {
    /// The executor's claim environment (empty without `poolRef.env`, read from nothing); `None`
    /// (reported in the status, reason `EnvUnavailable`) while it cannot have all of it.
    pub(crate) async fn claim_env(&self, executor: &BriqExecutor) -> Result<Option<ClaimEnv>> {
        let entries = executor
            .spec
            .pool_ref
            .as_ref()
            .map_or(&[][..], |pool_ref| &pool_ref.env[..]);
        if entries.is_empty() {
            return Ok(Some(ClaimEnv::new()));
        }
        let namespace = executor.namespace().unwrap_or_default();
        let api: Api<Secret> = Api::namespaced(self.shared.client.clone(), &namespace);
        let mut secrets = BTreeMap::new();
        for name in secrets_named(entries) {
            let secret = api.get_opt(&name).await?;
            secrets.insert(name, secret);
        }
        match resolve(&namespace, entries, &secrets) {
            Ok(env) => Ok(Some(env)),
            Err(why) => {
                let message = format!("{why}; it takes no sandbox until it can have its env");
                let waiting = state("False", false, ExecutorReason::EnvUnavailable, message);
                self.report(executor, waiting, sandbox_fields(executor))
                    .await?;
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests;
