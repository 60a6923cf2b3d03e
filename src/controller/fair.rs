//! The operator's work shared fairly across namespaces, as the API server's priority and
//! fairness queues share its own: a bounded number of work slots, and when they are all taken,
//! the next free one goes to the namespace whose turn it is, round-robin over the namespaces with
//! work waiting, whatever one namespace has queued.
//!
//! Within a namespace, work someone waits for (a claim, an agent's action) goes before
//! background work (a pool's members being made ready or handed over): a burst of claims and
//! the refill it sets off share the API server, and the claims come first.
//!
//! A slot bounds the operator's *work* (API server calls, decisions), not the actions in
//! flight: a reconcile gives its slot back while it only waits for briq (an exec running in the
//! kernel, up to 40 s) and takes one again to write the result. So long actions of one
//! namespace never hold the slots another namespace's one-line action needs.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
};

use tokio::sync::oneshot;

/// Whether someone waits for a piece of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Someone waits for it: a claim, an executor of a user's own, an action.
    Foreground,
    /// Nobody waits for it yet: a pool member being made ready, or handed over.
    Background,
}

/// One namespace's waiters, each priority in the order they came.
#[derive(Debug, Default)]
struct Queues {
    foreground: VecDeque<u64>,
    background: VecDeque<u64>,
}

impl Queues {
    fn is_empty(&self) -> bool {
        self.foreground.is_empty() && self.background.is_empty()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.foreground.len() + self.background.len()
    }
}

/// Whose turn it is: round-robin over the namespaces with waiters; within a namespace its
/// foreground waiters before its background ones, each in the order they came. Pure;
/// [`FairShare`] applies it.
#[derive(Debug, Default)]
pub struct Turns {
    /// Namespaces with waiters, the next to be served first.
    order: VecDeque<String>,
    waiting: HashMap<String, Queues>,
}

impl Turns {
    /// `ticket` of `namespace` waits for a slot.
    pub fn push(&mut self, namespace: &str, ticket: u64, priority: Priority) {
        let queues = self.waiting.entry(namespace.to_owned()).or_default();
        if queues.is_empty() {
            self.order.push_back(namespace.to_owned());
        }
        match priority {
            Priority::Foreground => queues.foreground.push_back(ticket),
            Priority::Background => queues.background.push_back(ticket),
        }
    }

    /// The waiter served next: the first of the namespace whose turn it is (foreground first),
    /// which then goes to the back of the line if it has more.
    pub fn next(&mut self) -> Option<u64> {
        let namespace = self.order.pop_front()?;
        let queues = self.waiting.get_mut(&namespace)?;
        let ticket = queues
            .foreground
            .pop_front()
            .or_else(|| queues.background.pop_front());
        if queues.is_empty() {
            self.waiting.remove(&namespace);
        } else {
            self.order.push_back(namespace);
        }
        ticket
    }

    /// A waiter that stopped waiting.
    pub fn remove(&mut self, namespace: &str, ticket: u64) {
        let Some(queues) = self.waiting.get_mut(namespace) else {
            return;
        };
        queues.foreground.retain(|t| *t != ticket);
        queues.background.retain(|t| *t != ticket);
        if queues.is_empty() {
            self.waiting.remove(namespace);
            self.order.retain(|n| n != namespace);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// How many wait.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.waiting.values().map(Queues::len).sum()
    }
}

#[derive(Debug, Default)]
struct Slots {
    in_use: usize,
    turns: Turns,
    next_ticket: u64,
    /// The waiters' channels, by ticket: a slot is handed over by sending on one.
    grants: HashMap<u64, oneshot::Sender<()>>,
}

/// A bounded number of work slots, handed out fairly across namespaces ([`Turns`]).
#[derive(Debug)]
pub struct FairShare {
    capacity: usize,
    slots: Mutex<Slots>,
}

/// A work slot, given back when dropped: to the next waiter whose turn it is, if any.
#[derive(Debug)]
pub struct Slot {
    share: Arc<FairShare>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.share.give_back();
    }
}

impl FairShare {
    /// `capacity` slots (at least one).
    pub fn new(capacity: usize) -> Arc<FairShare> {
        Arc::new(FairShare {
            capacity: capacity.max(1),
            slots: Mutex::default(),
        })
    }

    /// A slot for work of `namespace`: at once while one is free and nobody waits, else when
    /// its namespace's turn comes and no foreground work of it waits before it.
    pub async fn take(self: &Arc<Self>, namespace: &str, priority: Priority) -> Slot {
        let (ticket, granted) = {
            let mut slots = self.slots.lock().expect("fair share");
            if slots.in_use < self.capacity && slots.turns.is_empty() {
                slots.in_use += 1;
                return Slot {
                    share: self.clone(),
                };
            }
            slots.next_ticket += 1;
            let ticket = slots.next_ticket;
            let (send, granted) = oneshot::channel();
            slots.turns.push(namespace, ticket, priority);
            slots.grants.insert(ticket, send);
            (ticket, granted)
        };
        // Should this wait be dropped (its reconcile cancelled), a slot granted meanwhile goes
        // back, and the turn is given up.
        let mut waiting = Waiting {
            share: self,
            namespace,
            ticket,
            granted: Some(granted),
        };
        let granted = waiting.granted.as_mut().expect("still waiting");
        let _ = granted.await;
        waiting.granted = None;
        Slot {
            share: self.clone(),
        }
    }

    /// How many wait for a slot.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.slots.lock().expect("fair share").turns.len()
    }

    /// Hands a slot to the next waiter whose turn it is, else frees it.
    fn give_back(&self) {
        let mut slots = self.slots.lock().expect("fair share");
        while let Some(ticket) = slots.turns.next() {
            if let Some(grant) = slots.grants.remove(&ticket)
                && grant.send(()).is_ok()
            {
                return;
            }
        }
        slots.in_use = slots.in_use.saturating_sub(1);
    }
}

/// A reconcile's work slot, which it gives back while it only waits.
#[derive(Debug)]
pub struct Held {
    share: Arc<FairShare>,
    namespace: String,
    priority: Priority,
    slot: Mutex<Option<Slot>>,
}

impl Held {
    /// Takes a slot of `share` for work of `namespace`.
    pub async fn take(share: &Arc<FairShare>, namespace: &str, priority: Priority) -> Held {
        let slot = share.take(namespace, priority).await;
        Held {
            share: share.clone(),
            namespace: namespace.to_owned(),
            priority,
            slot: Mutex::new(Some(slot)),
        }
    }

    /// Waits for `wait` without the slot (briq running code or setting a sandbox up, another
    /// reconcile finishing): a wait must not keep other namespaces' work waiting. The slot is
    /// taken again, in turn, after.
    pub async fn without<T>(&self, wait: impl Future<Output = T>) -> T {
        drop(self.slot.lock().expect("work slot").take());
        let outcome = wait.await;
        let slot = self.share.take(&self.namespace, self.priority).await;
        *self.slot.lock().expect("work slot") = Some(slot);
        outcome
    }
}

/// A waiter for a slot; dropped before its slot came, it leaves the line.
struct Waiting<'a> {
    share: &'a Arc<FairShare>,
    namespace: &'a str,
    ticket: u64,
    granted: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some(mut granted) = self.granted.take() else {
            return;
        };
        let handed_over = {
            let mut slots = self.share.slots.lock().expect("fair share");
            slots.turns.remove(self.namespace, self.ticket);
            slots.grants.remove(&self.ticket);
            granted.try_recv().is_ok()
        };
        if handed_over {
            self.share.give_back();
        }
    }
}

#[cfg(test)]
mod tests;
