"""A run's quality figures in Redis: each node's last snapshot, summed into the fleet's.

Kept apart from the run's bookkeeping figures (``{<spider>}:run:<id>:figures``) because they are
many (a count per field, per price bucket) and of interest only here, but summed the same way:
each node writes its whole cumulative snapshot under its node id, so a node killed with SIGKILL
still counts for what it reported last, and a resumed run adds the new nodes to the old ones.
"""

from __future__ import annotations

import json
from typing import Any

from ..runs.state import FIGURES_KEEP, sum_node_figures


def quality_key(spider_name: str, run_id: int) -> str:
    from ..queue.keys import run_quality_key

    return run_quality_key(spider_name, run_id)


def write(server: Any, spider_name: str, run_id: int, node_id: str, figures: dict[str, float]) -> None:
    key = quality_key(spider_name, run_id)
    pipe = server.pipeline(transaction=False)
    pipe.hset(key, node_id, json.dumps(figures))
    # Run ids never repeat, so an expiry is all the cleaning these keys need.
    pipe.expire(key, FIGURES_KEEP)
    pipe.execute()


def summed(server: Any, spider_name: str, run_id: int) -> dict[str, float]:
    return sum_node_figures(server.hgetall(quality_key(spider_name, run_id)).values())
