"""The local spool of an archive in a bucket: files are written here, then uploaded whole."""

from __future__ import annotations

import os


def spool_path(spool: str, name: str) -> str:
    """Where a bucket's file *name* is written before its upload (its folder made)."""
    path = os.path.join(spool, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path
