//! Events that a burst of work makes and that nothing is ordered against go out from one task
//! of their own, one at a time, in the order they were queued: the `Claimed` note after a
//! claim's Ready, say. 100 claims at once are 100 such Events; published where they happen,
//! each would be an API server write beside the claims' own, at the moment the claims compete
//! for it. Events a reader orders against a state (the `Unusable` beside the status that says
//! so, `SandboxDestroyed` before the finalizer lets the executor go) are published in place.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

/// How many Events may wait to go out; past that, new ones are dropped (and logged), as the API
/// server's own Event handling drops what it cannot keep up with.
const QUEUE: usize = 4096;

enum Queued {
    Event(Box<(Event, ObjectReference)>),
    /// Answered once everything queued before it went out.
    Flush(oneshot::Sender<()>),
}

/// Where the controllers publish Events.
#[derive(Clone)]
pub struct Events {
    queue: mpsc::Sender<Queued>,
}

impl Events {
    /// The queue and the task that publishes what it holds with `recorder`; the task ends when
    /// every [`Events`] is dropped.
    pub fn start(recorder: Recorder) -> (Events, tokio::task::JoinHandle<()>) {
        let (queue, mut queued) = mpsc::channel(QUEUE);
        let publisher = tokio::spawn(async move {
            while let Some(next) = queued.recv().await {
                match next {
                    Queued::Event(event) => {
                        let (event, reference) = *event;
                        if let Err(error) = recorder.publish(&event, &reference).await {
                            warn!(%error, reason = %event.reason, "could not publish an event");
                        }
                    }
                    Queued::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
        (Events { queue }, publisher)
    }

    /// Queues `event` about `reference`; returns at once.
    pub fn publish(&self, event: Event, reference: ObjectReference) {
        let reason = event.reason.clone();
        if let Err(error) = self
            .queue
            .try_send(Queued::Event(Box::new((event, reference))))
        {
            warn!(%error, %reason, "an event was dropped: too many wait to be published");
        }
    }

    /// Waits, at most `within`, until every Event queued so far went out (at shutdown).
    pub async fn flush(&self, within: Duration) {
        let (done, flushed) = oneshot::channel();
        if self.queue.send(Queued::Flush(done)).await.is_ok() {
            let _ = tokio::time::timeout(within, flushed).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::events::{EventType, Reporter};

    use super::*;

    /// A client of an API server that takes connections and never answers.
    async fn silent_api_server() -> (kube::Client, tokio::net::TcpListener) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let config = kube::Config::new(url.parse().unwrap());
        (kube::Client::try_from(config).unwrap(), listener)
    }

    fn event(reason: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: None,
            action: "Claim".into(),
            secondary: None,
        }
    }

    #[tokio::test]
    async fn an_api_server_slow_to_take_events_holds_up_no_step_that_publishes_them() {
        let (client, _listener) = silent_api_server().await;
        let reporter = Reporter {
            controller: "briq-operator".into(),
            instance: None,
        };
        let (events, publisher) = Events::start(Recorder::new(client, reporter));
        // Each publish would wait for the API server's answer, which never comes; queued, the
        // step that publishes goes on. (The bound only tells a hang from a return.)
        let publishing = async {
            for n in 0..100 {
                let reference = ObjectReference {
                    name: Some(format!("claim-{n:03}")),
                    ..ObjectReference::default()
                };
                events.publish(event("Claimed"), reference);
            }
        };
        let hang = Duration::from_secs(30);
        assert!(tokio::time::timeout(hang, publishing).await.is_ok());
        // At shutdown, the wait for what is still queued ends with its own bound.
        let flushing = events.flush(Duration::from_millis(200));
        assert!(tokio::time::timeout(hang, flushing).await.is_ok());
        publisher.abort();
    }
}
