//! Claims: a claimer (an executor with a `poolRef`) takes a Ready member of its pool, and the
//! member's sandbox and kernel with it. A claim is one [`Claim`](marks::Claim) (marks.rs): the
//! marks it leaves on the member and on the claimer are derived from it, and read back through
//! it. Its path, in order:
//!
//! | file | what |
//! | --- | --- |
//! | `marks.rs` | the claim, the marks it writes on the member (taken) and the claimer (recorded, settled), and their reading; what a claimer's reconcile does first ([`first`](marks::first)) |
//! | `take.rs` | the plan (take, wait, fall back, mismatch) and the member's conditional write |
//! | `record.rs` | the claimer's record of the claim with its Ready, then its settling (finalizer, annotations) |
//! | `handover.rs` | this process's handovers between the member's write and the cache showing the claimer's record |
//! | `env.rs` | the claimer's per-claim environment, given to the claimed kernel |

pub(super) mod env;
pub(super) mod handover;
pub(super) mod marks;
pub(super) mod record;
pub(super) mod take;
