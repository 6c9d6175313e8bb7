"""Binaries the tests need, located or installed (never skipped).

CI and developers run as root on Debian, so a missing tool is installed from Debian's packages
the first time a test asks for it; anywhere else the test fails saying what to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

_lock = threading.Lock()
_apt_updated = False


def ensure_binary(name: str, package: str) -> str:
    """Return the path of *name*, installing Debian's *package* if it is missing."""
    global _apt_updated
    with _lock:
        found = shutil.which(name)
        if found:
            return found
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            raise RuntimeError(f"{name} is needed: install it (Debian package {package!r})")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if not _apt_updated:
            subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
            _apt_updated = True
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package],
            check=True,
            env=env,
            timeout=900,
        )
        found = shutil.which(name)
        if not found:
            raise RuntimeError(f"installed {package!r} but {name} is still not on PATH")
        return found
