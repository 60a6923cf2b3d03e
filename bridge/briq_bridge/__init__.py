"""briq-operator's sandbox bridge.

`briq_bridge/sandbox.py` is the whole bridge: the operator uploads that one file into the
sandbox as `.briq/bridge.py`. This package only exists so tests and tools can locate it.
"""

from pathlib import Path

SANDBOX_SCRIPT = Path(__file__).with_name("sandbox.py")
