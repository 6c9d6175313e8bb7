"""One dead letter as stored (see :mod:`.dead_letters`): the queue writes unreadable and unsigned
entries as dead letters itself, so the format lives apart from the dead-letter store."""

from __future__ import annotations

import json
import time


def entry(reason: str, attempts: int, url: str | None, data: str | bytes, count: int = 1) -> str:
    """One dead letter, as stored: the request's queue JSON plus why and how often it failed."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")  # the queue's JSON is UTF-8
    return json.dumps(
        {"at": time.time(), "reason": reason, "attempts": attempts, "url": url, "request": data, "count": count},
        ensure_ascii=False,
    )
