//! The two controllers: `BriqExecutor` (sandbox lifecycle) and `Execution` (one action each,
//! in order, at most once).
//!
//! Status ownership (server-side apply): the executor controller owns the executor's
//! conditions, sandbox id and timestamps ([`EXECUTOR_MANAGER`]); `unusable` is written once, by
//! whichever controller finds the executor unusable ([`UNUSABLE_MANAGER`]); the execution
//! controller owns the executor's execution counters ([`EXECUTIONS_MANAGER`]) and the whole
//! status of every Execution ([`EXECUTOR_MANAGER`]). Each applies its complete set every time,
//! so no manager ever drops another's fields.

//! Layers, each importing only those below it (a unit test, `crate::layering`, fails on a
//! circle):
//!
//! | layer | modules |
//! | --- | --- |
//! | wiring | [`run`]: the watches, caches and controllers, started and stopped together |
//! | controllers | `executor/`, `execution/`, `pool/`, `orphans` (the sweeper) |
//! | triggers | `wake` (what wakes whom), `recheck` (the bounded rechecks, pure) |
//! | shared effects | `status`, `publish`, `credentials`, `key_guard` (keys in use), `index` (store views), `requeue` |
//! | shared state | `context` (error, settings, [`Shared`]), `backoff`, `events`, `fair`, `cache`, `ownership` |
//! | pure policy | `class` (which class, its limits) |
//!
//! Names written on objects (annotations, finalizers, field managers) live in [`crate::crd`]'s
//! `keys`, predicates of one object on its type (`Execution::finished`), and usage counting in
//! [`crate::usage`], so that no controller imports another to learn them.

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
pub use execution::CANCEL_GRACE;
pub use orphans::orphans;
pub use run::{Observer, run, run_observed};
