"""What the engine is doing, from its private slot (``crawler.engine._slot``): Scrapy has no
public way to ask which requests are still in progress, to reach the scheduler in use, or to
wake the request loop before its 5 s heartbeat.

Every reader falls back to a safe answer when the slot is not there (a Scrapy that renamed it,
an engine not open yet): no request known in progress (callers then keep what they hold until
close), no scheduler, no early wake-up (the heartbeat still comes).
"""

from __future__ import annotations

from typing import Any


def _slot(crawler: Any) -> Any:
    # crawler._engine, not crawler.engine: the property raises once the crawl is over.
    return getattr(getattr(crawler, "_engine", None), "_slot", None)


def in_progress(crawler: Any) -> list[Any] | None:
    """Requests the engine still works on (downloading, in a callback, or with items in the
    pipelines); None when unknown."""
    inprogress = getattr(_slot(crawler), "inprogress", None)
    return None if inprogress is None else list(inprogress)


def scheduler(crawler: Any) -> Any:
    """The scheduler the engine uses, or None."""
    return getattr(_slot(crawler), "scheduler", None)


def request_loop(crawler: Any) -> Any:
    """The engine's request loop (a ``CallLaterOnce``: ``.schedule()`` runs it soon), or None."""
    return getattr(_slot(crawler), "nextcall", None)


def downloads(crawler: Any) -> int:
    """Downloads in flight in this process (0 when unknown)."""
    downloader = getattr(getattr(crawler, "_engine", None), "downloader", None)
    return len(getattr(downloader, "active", ()))


def wake(crawler: Any) -> bool:
    """Run the engine's request loop now rather than at its next heartbeat; False if unknown."""
    loop = request_loop(crawler)
    if loop is None:
        return False
    loop.schedule()
    return True
