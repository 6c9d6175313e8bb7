"""Retention: drop index rows older than ``ARCHIVE_RETENTION_DAYS``, then every file no kept
row points at, either as its own record or as the body of a kept revisit."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from .store import Store


def prune(conn: Any, store: Store, retention_days: float, now: datetime) -> tuple[int, int]:
    """Returns (index rows deleted, files deleted)."""
    cutoff = now - timedelta(days=retention_days)
    with conn, conn.cursor() as cur:
        cur.execute("DELETE FROM archive_index WHERE fetched_at < %s", (cutoff,))
        rows = cur.rowcount
        cur.execute("SELECT file FROM archive_index UNION SELECT payload_file FROM archive_index")
        kept = {row[0] for row in cur.fetchall()}
    files = 0
    # A file still being written by a live crawl is not indexed yet and is not old either.
    for name in list(store.names()):
        if name not in kept and _file_time(name) < cutoff:
            store.delete(name)
            files += 1
    return rows, files


def _file_time(name: str) -> datetime:
    """The time a file was started, from its name (``…-YYYYmmddTHHMMSS-host-pid-seq.warc.gz``)."""
    from datetime import timezone

    stamp = name.rsplit("/", 1)[-1].split("-")[-4]
    return datetime.strptime(stamp, "%Y%m%dT%H%M%S").replace(tzinfo=timezone.utc)
