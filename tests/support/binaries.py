"""Binaries the tests need, located (never skipped, never installed here).

`make tools` (which `make test` runs first) installs them from Debian's packages; a test that
finds one missing fails saying so.
"""

from __future__ import annotations

import shutil


def ensure_binary(name: str, package: str) -> str:
    """Return the path of *name*; fail naming the Debian *package* and `make tools` if it is missing."""
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} is needed: run `make tools` (it installs Debian's {package!r})")
    return found
