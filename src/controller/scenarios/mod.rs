//! The controllers' fast tier: scenarios that drive the real `executor::reconcile` and
//! `execution::reconcile` against an in-memory briq (`bridge::fake`) and an in-memory API server
//! (`api_server.rs`), and assert the exact sequence of requests each makes to both. Milliseconds,
//! no control plane: beside the pure decisions' table tests and the end-to-end tests (`tests/`),
//! never instead of them.
//!
//! | file | scenarios |
//! |---|---|
//! | `executor_lifecycle.rs` | a new executor: finalizer, sandbox created and provisioned, `KernelReady`; its deletion: sandbox destroyed, finalizer removed |
//! | `executor_claim.rs` | a warm claim: a Ready member of its pool taken, the claimer recorded with its `Ready` (two writes, no briq call), then settled (finalizer, annotations) |
//! | `executor_suspension.rs` | `spec.suspend`: `Suspending`, namespace saved, sandbox stopped, `Suspended`; resumed: sandbox started, kernel started, namespace restored |
//! | `executor_fork.rs` | a source with a fork waiting: `Forking` before the sandbox is touched, one `fork-save`, the snapshot recorded for that fork with `KernelReady` |
//! | `execution_run.rs` | an Execution on a ready executor: `Completed`, the code sent once (at hand, or brought by the `Running` write); an answer lost: learnt from the journal, never sent twice |
//! | `execution_bookkeeping.rs` | what the execution controller keeps in memory: nothing of a finished Execution once the cache shows it, nothing, after the sweep, of one deleted while a reconcile told it to wait for a place |
//! | `execution_cancel.rs` | `spec.cancel`: the journal claims an attempt never sent, interrupts a running one, or keeps a result that came first |
//!
//! `world.rs` builds the contexts as `run/controllers.rs` does and the objects scenarios start
//! from.

mod api_server;
mod execution_bookkeeping;
mod execution_cancel;
mod execution_run;
mod executor_claim;
mod executor_fork;
mod executor_lifecycle;
mod executor_suspension;
mod world;
