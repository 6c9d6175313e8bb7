"""The two facts about the current run that history, gone-marking and the archive need.

The run bookkeeping lives elsewhere (the run id and whether the run completed are crawl
stats); everything here reads it only through these two functions, so that where the facts
come from can change in one place.
"""

from __future__ import annotations

from typing import Any


def current_run_id(crawler: Any) -> int | None:
    """The id of the run this crawl belongs to, or None while runs are not tracked."""
    return crawler.stats.get_value("run/id")


def run_finished(crawler: Any, reason: str) -> bool:
    """True when this node's leaving finished the run: queue empty, nothing leased, no other
    live node (the scheduler records the outcome), whatever this node's own closing reason (a
    Ctrl-C in the final idle wait still ends a complete run)."""
    outcome = crawler.stats.get_value("run/outcome")
    if outcome is not None:
        return outcome == "finished"
    return reason == "finished"
