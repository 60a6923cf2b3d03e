//! The controllers: `BriqExecutor` (sandbox lifecycle, claims of pool members, and its class's
//! `BriqInterface` condition), `Execution` (one action each, in order, at most once) and
//! `BriqExecutorPool` (unclaimed members kept ready); beside them the orphan sweeper (sandboxes
//! and key Secrets left by executors gone without their finalizer). Classes have no controller:
//! their watch wakes the executors waiting on a class, and every pool.
//!
//! Status ownership (server-side apply): the executor controller owns the executor's
//! conditions, sandbox id and timestamps ([`EXECUTOR_MANAGER`]); `unusable` is written once, by
//! whichever controller finds the executor unusable ([`UNUSABLE_MANAGER`]); the execution
//! controller owns the executor's execution counters ([`EXECUTIONS_MANAGER`]) and the whole
//! status of every Execution ([`EXECUTOR_MANAGER`]). Each applies its complete set every time,
//! so no manager ever drops another's fields.
//!
//! Layers, each importing only those below it (a unit test, `crate::layering`, fails on a
//! circle):
//!
//! | layer | modules |
//! | --- | --- |
//! | wiring | [`run`](fn@run): the entry, starting and stopping together `run/watches` (the caches, the watches that fill them, the wake-ups), `run/controllers` (the contexts, the three `Controller`s) and `run/background` (the observer's reporting, the sweeps, the count writes) |
//! | controllers | `executor/`, `execution/`, `pool/`, `orphans` (the sweeper) |
//! | triggers | `wake` (what wakes whom) |
//! | shared effects | `status`, `publish`, `credentials`, `key_guard` (keys in use), `index` (store views), `requeue` |
//! | shared state | `context` (error, settings, `Shared`), `backoff`, `fair`, `cache`, `ownership` |
//! | pure policy | `class` (which class, its limits), `recheck` (every timing: the bounded rechecks, graces and deadlines) |
//!
//! Names written on objects (annotations, finalizers, field managers) live in [`crate::crd`]'s
//! `keys`, predicates of one object on its type (`Execution::finished`), and usage counting in
//! [`crate::usage`], so that no controller imports another to learn them.
//!
//! [`EXECUTOR_MANAGER`]: crate::crd::EXECUTOR_MANAGER
//! [`UNUSABLE_MANAGER`]: crate::crd::UNUSABLE_MANAGER
//! [`EXECUTIONS_MANAGER`]: crate::crd::EXECUTIONS_MANAGER

mod backoff;
mod cache;
pub mod class;
mod context;
mod credentials;
mod execution;
mod executor;
mod fair;
mod index;
mod key_guard;
mod orphans;
mod ownership;
mod pool;
mod publish;
mod recheck;
mod requeue;
mod run;
#[cfg(test)]
mod scenarios;
mod status;
mod wake;

pub use context::{Error, Result, Settings};
pub use orphans::orphans;
pub use recheck::CANCEL_GRACE;
pub use run::{ExecutorKeys, Observer, run, run_observed};
