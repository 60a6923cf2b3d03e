//! Every name the operator writes on objects besides their spec and status: annotations, labels,
//! finalizers and server-side apply field managers. One home, below every controller, so that a
//! controller never imports another to learn a name.

// Finalizers.
/// On an executor: its sandbox is destroyed before the executor goes.
pub const FINALIZER: &str = "briq.cloud/destroy-sandbox";
/// On a Secret whose API key an executor with a sandbox uses: the Secret outlives the sandbox.
pub const KEY_IN_USE_FINALIZER: &str = "briq.cloud/api-key-in-use";

// An executor's sandbox and class.
/// Set before a sandbox is created and removed once its id is recorded: if the operator stops in
/// between, the next reconcile looks the sandbox up by its deterministic name instead of
/// creating a second one.
pub const CREATE_PENDING_ANNOTATION: &str = "briq.cloud/sandbox-create-pending";
/// The sandbox id, kept in metadata too so that it survives a lost or rewritten status.
pub const SANDBOX_ID_ANNOTATION: &str = "briq.cloud/sandbox-id";
/// On an executor, written by the operator with its pending-create mark: the class it
/// was made under. An executor naming no class keeps the default class it got, even when
/// another class becomes the default later (its sandbox was made with that class's key).
pub const CLASS_ANNOTATION: &str = "briq.cloud/class";

// Pools and claims.
/// On a pool's unclaimed members: the pool's name. Removed when a member is claimed, so the
/// scale subresource's selector counts only what the pool still offers.
pub const POOL_LABEL: &str = "briq.cloud/pool";
/// On a pool's members: the hash of the template they were made from.
pub const TEMPLATE_HASH_LABEL: &str = "briq.cloud/pool-template-hash";
/// On a pool's members, from their creation on and for good: the pool's name. Guarded by the
/// admission policy (only the operator writes `briq.cloud/` annotations). A member runs no code
/// of its own.
pub const POOL_MEMBER_ANNOTATION: &str = "briq.cloud/pool-member";
/// On a claimed member: the uid of the executor it was handed to (written once, with the
/// member's resourceVersion as precondition: exactly one claimer wins).
pub const CLAIMED_BY_ANNOTATION: &str = "briq.cloud/claimed-by";
/// The same uid as a label, so that a claimer finds its member with one selective LIST after a
/// crash between the two halves of the handover.
pub const CLAIMED_BY_LABEL: &str = "briq.cloud/claimed-by";
/// On a claimer: the name of the member whose sandbox and kernel it took. Only a pointer: the
/// member's own `claimed-by` must name the claimer's uid for the sandbox to count as its own.
pub const CLAIMED_MEMBER_ANNOTATION: &str = "briq.cloud/claimed-member";
/// On a claimer that stopped waiting for its pool: why it creates a sandbox of its own.
pub const POOL_FALLBACK_ANNOTATION: &str = "briq.cloud/pool-fallback";

// Keys and classes.
/// The label a Secret needs for the operator to use it as an API key (opt-in).
pub const API_KEY_LABEL: &str = "briq.cloud/api-key";
pub const API_KEY_LABEL_VALUE: &str = "true";
/// The label a Secret needs for the operator to deliver its keys into a claimer's kernel
/// (`poolRef.env[].valueFrom.secretKeyRef`; opt-in, as [`API_KEY_LABEL`]).
pub const CLAIM_ENV_LABEL: &str = "briq.cloud/claim-env";
pub const CLAIM_ENV_LABEL_VALUE: &str = "true";
/// On a class: `"true"` makes it the class of executors that name none (and bring no key of
/// their own), as `storageclass.kubernetes.io/is-default-class` does for volumes.
pub const DEFAULT_CLASS_ANNOTATION: &str = "briq.cloud/is-default-class";

// Server-side apply field managers of status (see controller/mod.rs for who owns what).
pub const EXECUTOR_MANAGER: &str = "briq-operator";
pub const UNUSABLE_MANAGER: &str = "briq-operator-unusable";
pub const EXECUTIONS_MANAGER: &str = "briq-operator-executions";

/// The label every fork made by `kubectl briq fork` or MCP carries: its source's name, so that
/// `get -l` lists a source's forks.
pub const FORKED_FROM_LABEL: &str = "briq.cloud/forked-from";

/// Who asked for an object the operator created on their behalf (through its MCP endpoint):
/// the user kube-apiserver authenticated. Only the operator sets `briq.cloud/` annotations.
pub const REQUESTED_BY_ANNOTATION: &str = "briq.cloud/requested-by";

/// On an Execution made by MCP's `run_python`: the caller's `request_id`, which named it.
pub const MCP_REQUEST_ID_ANNOTATION: &str = "briq.cloud/mcp-request-id";
