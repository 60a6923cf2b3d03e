"""The installed distribution's version, which is the briq-operator crate's (Cargo.toml's
`[package] version`, written in pyproject.toml; tests/test_distribution.py checks they agree)."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "briq-operator-client"


def _from_checkout() -> str:
    """Imported from a checkout that was not installed: the pyproject.toml beside the package."""
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return "0+unknown"
    found = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    return found.group(1) if found else "0+unknown"


try:
    __version__ = metadata.version(DISTRIBUTION)
except metadata.PackageNotFoundError:
    __version__ = _from_checkout()
