"""Retention: drop index rows older than ``ARCHIVE_RETENTION_DAYS``, then each file those rows
were in, unless a kept row still points at it, as its own record or as the body of a kept
revisit. Files never indexed (one a live crawl is still writing to S3's spool) are not touched."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from .store import Store


def prune(conn: Any, store: Store, retention_days: float, now: datetime) -> tuple[int, int]:
    """Returns (index rows deleted, files deleted)."""
    cutoff = now - timedelta(days=retention_days)
    with conn, conn.cursor() as cur:
        cur.execute("DELETE FROM archive_index WHERE fetched_at < %s RETURNING file, payload_file", (cutoff,))
        deleted = cur.fetchall()
        candidates = {f for row in deleted for f in row}
        cur.execute(
            "SELECT file FROM archive_index WHERE file = ANY(%(f)s)"
            " UNION SELECT payload_file FROM archive_index WHERE payload_file = ANY(%(f)s)",
            {"f": list(candidates)},
        )
        kept = {row[0] for row in cur.fetchall()}
        # Deleted in the same transaction as the rows: a failure leaves both, never a dangling row.
        gone = sorted(candidates - kept)
        for name in gone:
            store.delete(name)
    return len(deleted), len(gone)
