"""Where the live guard records a run's break (a field whose coverage fell), for every node,
the gone-marking and the run's report to read."""

from __future__ import annotations

import json
from typing import Any

from ..queue.keys import run_quality_key

#: Sent (``broken``: name -> figures) when a node learns of a break, its own or the fleet's:
#: ``Type.field`` (coverage or unreadable values), ``rejects/field``, ``values/Type.field``.
quality_broke = object()


def break_key(spider: str, run_id: int) -> str:
    return f"{run_quality_key(spider, run_id)}:break"


def run_break(server: Any, spider: str, run_id: int) -> dict[str, Any]:
    """The run's break as the guard recorded it (field -> [coverage, expected]), {} if none."""
    if not run_id:
        return {}
    raw = server.hgetall(break_key(spider, run_id))
    return {(k.decode() if isinstance(k, bytes) else k): json.loads(v) for k, v in raw.items()}
