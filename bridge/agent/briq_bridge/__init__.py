"""The former name of `briq_operator_client` (when the distribution was `briq-bridge`), kept so
that code written for it runs unchanged: `from briq_bridge import KubernetesExecutor`, `import
briq_bridge.kubernetes_executor` and `from briq_bridge.vocabulary import ...` give the very same
objects as the new names. New code imports `briq_operator_client`.
"""

import sys

from briq_operator_client import *  # noqa: F403
from briq_operator_client import (  # noqa: F401
    __all__,
    __version__,
    _trace,
    _version,
    kubernetes_executor,
    vocabulary,
)

# The submodules under their old names: `import briq_bridge.vocabulary` finds them here instead
# of loading a second copy (whose classes would differ from the new package's).
for _submodule in ("_trace", "_version", "kubernetes_executor", "vocabulary"):
    sys.modules[f"{__name__}.{_submodule}"] = sys.modules[f"briq_operator_client.{_submodule}"]
del _submodule
