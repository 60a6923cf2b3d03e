"""briq-operator's agent-side client: a smolagents remote executor driven through Kubernetes.

`KubernetesExecutor` runs each agent action as a briq-operator `Execution` (`pip install
briq-operator-client`). The sandbox-side bridge is a separate distribution
(`bridge/sandbox/briq_sandbox.py`) that the operator uploads into each sandbox; nothing here
imports it. `import briq_bridge` (this package's former name) still works: it is an alias of
this one, shipped in the same distribution.
"""

from ._version import __version__  # noqa: F401
from .kubernetes_executor import *  # noqa: F403
from .kubernetes_executor import __all__  # noqa: F401
