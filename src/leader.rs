//! Leader election on a `coordination.k8s.io` Lease, with kube-lease-manager: only the replica
//! holding the lease runs the controllers, so two replicas never run the same Execution.
//!
//! - Standby: try to take the lease whenever it is free or expired.
//! - Leading: run the controllers; the lease manager renews the lease `grace` seconds before it
//!   expires. A failed renewal (a slow or briefly unavailable API server) is retried while the
//!   lease is surely still held ([`keep_retrying`]); if renewals keep failing until close to
//!   expiry, or the lease is found held by another replica, the controllers are dropped at once
//!   (not drained: another replica may be taking over) and this replica goes back to standby.
//!   An Execution cut off that way never runs twice: the sandbox's journal runs its attempt id
//!   once, and the next leader asks the journal what became of it, concluding it `Interrupted`
//!   only when nobody can tell.
//! - Shutdown (SIGTERM): the controllers stop taking new work and finish what runs, the lease is
//!   renewed meanwhile, then released so that a standby takes over at once.

use std::{future::Future, sync::Arc, time::Duration};

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::{
    http::{Health, Role},
    metrics::Metrics,
};

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// Unique per replica (and per process start).
    pub identity: String,
    /// How long the lease stays valid after a renewal, in seconds.
    pub duration_seconds: u64,
    /// The holder renews this many seconds before the lease expires (> 0, < duration).
    pub grace_seconds: u64,
}

impl LeaseConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.grace_seconds == 0 || self.grace_seconds >= self.duration_seconds {
            return Err(format!(
                "the lease grace ({}s) must be more than 0 and less than the lease duration ({}s)",
                self.grace_seconds, self.duration_seconds
            ));
        }
        Ok(())
    }
}

/// A lease identity: the host (pod) name and a random suffix, so that a restarted process never
/// mistakes its predecessor's lease for its own.
pub fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "briq-operator".into());
    format!("{host}_{:08x}", rand::random::<u32>())
}

/// The client the lease manager uses: requests time out well within the renewal grace, so that a
/// hanging API server shows up as a failed renewal before the lease expires.
pub fn lease_client(mut config: kube::Config, grace_seconds: u64) -> kube::Result<Client> {
    let timeout = Duration::from_millis(grace_seconds.max(1) * 1000 / 3);
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    crate::kube_client::client(config)
}

enum Outcome {
    /// Shutdown was requested and the controllers have stopped.
    Stopped,
    /// The lease is lost (or could not be renewed): the controllers were dropped.
    Lost,
}

/// Runs `lead` while this replica holds the lease, until `shutdown` resolves. `lead` is given a
/// stop signal: when it resolves the controllers stop gracefully.
pub async fn run<L, Fut>(
    client: Client,
    lease: LeaseConfig,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
    mut lead: L,
) where
    L: FnMut(oneshot::Receiver<()>) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        health.set_role(Role::Standby);
        metrics.set_leader(false);
        let manager = tokio::select! {
            manager = build(&client, &lease) => manager,
            () = &mut shutdown => return,
        };
        // Standby until the lease is ours.
        let acquired = loop {
            tokio::select! {
                changed = manager.changed() => match changed {
                    Ok(true) => break true,
                    Ok(false) => {}
                    Err(error) => {
                        warn!(%error, lease = %lease.name, "leader election failed; retrying");
                        break false;
                    }
                },
                () = &mut shutdown => {
                    release(&manager, &lease).await;
                    return;
                }
            }
        };
        if !acquired {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                () = &mut shutdown => return,
            }
        }
        info!(identity = %lease.identity, lease = %lease.name, "acquired the lease: starting the controllers");
        health.set_role(Role::Leader);
        metrics.set_leader(true);
        let grace = Duration::from_secs(lease.grace_seconds);
        let outcome = lead_while_held(&manager, &health, grace, shutdown.as_mut(), &mut lead).await;
        health.set_synced(false);
        metrics.set_leader(false);
        match outcome {
            Outcome::Stopped => {
                release(&manager, &lease).await;
                info!(lease = %lease.name, "controllers stopped, lease released");
                return;
            }
            Outcome::Lost if health.is_stopping() => return,
            Outcome::Lost => {
                warn!(identity = %lease.identity, lease = %lease.name, "lost the lease: controllers stopped; standing by");
            }
        }
    }
}

/// How long before the lease could expire a leader stops retrying a failed renewal and steps
/// down: another replica may take the lease once it expires, and two must never lead at once.
pub const STEP_DOWN_MARGIN: Duration = Duration::from_secs(2);

/// Whether a leader whose renewals have failed for `failing_for` still holds the lease for sure
/// and may retry: a renewal is due `grace` before expiry, so the lease lasts about `grace` after
/// the first failed one.
pub fn keep_retrying(failing_for: Duration, grace: Duration) -> bool {
    failing_for + STEP_DOWN_MARGIN < grace
}

/// Pause between retries of a failed renewal.
const RENEW_RETRY: Duration = Duration::from_millis(500);

async fn lead_while_held<L, Fut>(
    manager: &LeaseManager,
    health: &Health,
    grace: Duration,
    mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
    lead: &mut L,
) -> Outcome
where
    L: FnMut(oneshot::Receiver<()>) -> Fut,
    Fut: Future<Output = ()>,
{
    let (stop_tx, stop_rx) = oneshot::channel();
    let mut stop_tx = Some(stop_tx);
    let controllers = lead(stop_rx);
    let mut controllers = std::pin::pin!(controllers);
    // Since when renewals fail: a slow API server is not a lost lease, until it could be.
    let mut failing_since: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = &mut controllers => {
                if stop_tx.is_none() {
                    return Outcome::Stopped;
                }
                // The controllers never end on their own; should they, lead again.
                warn!("the controllers ended without being asked to");
                return Outcome::Lost;
            }
            changed = manager.changed() => match changed {
                Ok(true) => failing_since = None,
                Ok(false) => {
                    warn!("another replica holds the lease now");
                    return Outcome::Lost;
                }
                Err(error) => {
                    let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
                    if !keep_retrying(since.elapsed(), grace) {
                        warn!(%error, "could not renew the lease before it could expire: stepping down");
                        return Outcome::Lost;
                    }
                    warn!(%error, "could not renew the lease; retrying while it is still ours");
                    tokio::time::sleep(RENEW_RETRY).await;
                }
            },
            () = &mut shutdown, if stop_tx.is_some() => {
                info!("shutting down: no new Executions start; waiting for the running ones, keeping the lease");
                health.set_stopping();
                if let Some(stop) = stop_tx.take() {
                    let _ = stop.send(());
                }
            }
        }
    }
}

/// Builds the lease manager (which creates the Lease when missing), retrying until it works.
async fn build(client: &Client, lease: &LeaseConfig) -> LeaseManager {
    let mut delay = Duration::from_millis(500);
    loop {
        let built = LeaseManagerBuilder::new(client.clone(), &lease.name)
            .with_namespace(&lease.namespace)
            .with_identity(&lease.identity)
            .with_duration(lease.duration_seconds)
            .with_grace(lease.grace_seconds)
            .build()
            .await;
        match built {
            Ok(manager) => return manager,
            Err(error) => {
                warn!(%error, lease = %lease.name, namespace = %lease.namespace, "could not set up leader election; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

async fn release(manager: &LeaseManager, lease: &LeaseConfig) {
    match tokio::time::timeout(Duration::from_secs(5), manager.release()).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            warn!(%error, lease = %lease.name, "could not release the lease; it expires on its own")
        }
        Err(_) => {
            warn!(lease = %lease.name, "releasing the lease timed out; it expires on its own")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_retries_failed_renewals_only_while_the_lease_is_surely_its_own() {
        let s = Duration::from_secs;
        // (failing for, grace, keep retrying)
        let cases = [
            (s(0), s(5), true),
            (s(2), s(5), true),
            (Duration::from_millis(2_999), s(5), true),
            (s(3), s(5), false),
            (s(10), s(5), false),
            (s(0), s(2), false),
            (s(0), s(1), false),
        ];
        for (failing_for, grace, expected) in cases {
            assert_eq!(
                keep_retrying(failing_for, grace),
                expected,
                "{failing_for:?} {grace:?}"
            );
        }
    }
}
