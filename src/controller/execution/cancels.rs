//! Cancel requests the watch heard ([`Cancels`]), by Execution uid: the run this process waits
//! on hears its own ([`Actor::cancellable`](super::cancel)), whether the request came before
//! the wait began or during it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use kube::ResourceExt;
use tokio::sync::watch;

use crate::crd::Execution;

/// Cancel requests heard by the watch, by Execution uid, for the runs this process waits on.
#[derive(Default)]
pub struct Cancels {
    requested: Mutex<HashMap<String, Arc<watch::Sender<bool>>>>,
}

impl Cancels {
    /// The watch saw `execution`: a cancelled, unfinished one is asked to stop.
    pub fn heard(&self, execution: &Execution) {
        if execution.spec.cancel && !execution.finished() {
            self.request(execution);
        }
    }

    /// `execution` is cancelled (or deleted): a run of it waiting in this process hears it.
    pub fn request(&self, execution: &Execution) {
        if let Some(uid) = execution.uid() {
            self.sender(&uid).send_replace(true);
        }
    }

    /// Resolves once the Execution with `uid` is cancelled (at once if it is already); never
    /// when it is forgotten first.
    pub async fn requested(&self, uid: &str) {
        let mut heard = self.sender(uid).subscribe();
        if heard.wait_for(|cancelled| *cancelled).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The Execution with `uid` finished: nothing waits on it any more.
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Keeps only the requests of `live` Executions.
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        self.lock().retain(|uid, _| live(uid));
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    fn sender(&self, uid: &str) -> Arc<watch::Sender<bool>> {
        self.lock()
            .entry(uid.to_owned())
            .or_insert_with(|| Arc::new(watch::Sender::new(false)))
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<watch::Sender<bool>>>> {
        self.requested.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn execution(uid: &str, cancel: bool) -> Execution {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "briq.cloud/v1alpha1", "kind": "Execution",
            "metadata": { "name": "x", "namespace": "ns", "uid": uid },
            "spec": { "executorRef": { "name": "py" }, "code": "1", "cancel": cancel },
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_cancel_heard_before_the_run_waits_is_not_lost() {
        let cancels = Cancels::default();
        cancels.heard(&execution("u1", true));
        cancels.heard(&execution("u2", false));
        tokio::time::timeout(Duration::from_secs(1), cancels.requested("u1"))
            .await
            .expect("heard before the wait began");
        let not_cancelled =
            tokio::time::timeout(Duration::from_millis(10), cancels.requested("u2"));
        assert!(
            not_cancelled.await.is_err(),
            "not cancelled: the run goes on"
        );
    }

    #[tokio::test]
    async fn a_cancel_heard_while_the_run_waits_wakes_it() {
        let cancels = Arc::new(Cancels::default());
        let waiting = tokio::spawn({
            let cancels = cancels.clone();
            async move { cancels.requested("u1").await }
        });
        tokio::task::yield_now().await;
        cancels.request(&execution("u1", false));
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("woken")
            .unwrap();
        cancels.retain(|_| false);
        assert_eq!(cancels.len(), 0);
    }
}
