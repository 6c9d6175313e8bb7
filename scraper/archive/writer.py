"""Writes archive records in a thread of its own, so the crawl never waits on gzip or storage.

Files rotate by size and by age. An identical body (same payload digest) already archived
inside half the retention window is written as a WARC ``revisit`` record pointing at the
earlier response; the window keeps a revisit from pinning very old files (prune keeps every
file a kept revisit points at).

Index rows of a folder archive are written about once a second (the file is readable while
open); those of an S3 archive once its file is uploaded, so the index never names a missing
object. A process killed mid-file leaves that file's last second (folder) or the whole file
(S3, in the local spool) unindexed: the archive is a record of what was seen, and losing a
few records costs a re-fetch, never an item.

With ``ARCHIVE_REQUIRED`` an entry carries a ``done`` callback, called from this thread once its
record is on disk (written, flushed and, for a folder, indexed: the index is flushed whenever
the queue runs dry, so waiting pages are confirmed in groups) or with False when the archive has
failed; the middleware holds the page until then.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg2

from ..runtime.secrets import redact
from . import index, warc
from .store import Store

logger = logging.getLogger(__name__)
_DIGEST_CACHE = 100_000


@dataclass
class Entry:
    spider: str
    run_id: int | None
    url: str
    target_url: str
    fingerprint: str
    fetched_at: datetime
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    via: str
    provider: str | None
    request: dict[str, Any]
    done: Callable[[bool], None] | None = None


class ArchiveWriter:
    def __init__(
        self, store: Store, dsn: str, retention_days: float, file_size: int, file_age: float, stats: Any = None
    ) -> None:
        self.store = store
        self.dsn = dsn
        self.retention_days = retention_days
        self.file_size = file_size
        self.file_age = file_age
        self.stats = stats
        self._queue: queue.Queue[Entry | None] = queue.Queue(maxsize=10_000)
        self._thread = threading.Thread(target=self._run, name="archive-writer", daemon=True)
        self._file: Any = None
        self._name = ""
        self._opened = 0.0
        self._seq = 0
        self._unindexed: list[index.IndexRow] = []
        self._last_index = time.monotonic()
        self._digests: OrderedDict[str, tuple[str, datetime, str, int, int]] = OrderedDict()
        self._conn: Any = None
        self._indexed_end = 0  # bytes of the open file known to be on disk and indexed
        self.error: str | None = None
        # Set on the first storage failure (full disk, read-only folder, failing bucket): the
        # writer then stops archiving and only counts what it drops, so shutdown never waits
        # on a store that cannot take more.
        self.failed = False
        self.not_archived = 0
        self._pending = False  # an entry taken but not yet among the rows to index
        self._waiting: list[Callable[[bool], None]] = []  # ARCHIVE_REQUIRED: written, not yet confirmed

    def open(self) -> None:
        self._conn = psycopg2.connect(self.dsn, connect_timeout=10)
        index.ensure(self._conn)
        self._thread.start()

    def add(self, entry: Entry) -> None:
        # Blocks only when 10,000 records wait: the archive then slows the crawl, it never drops.
        self._queue.put(entry)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self._conn is not None:
            self._conn.close()

    # --- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                entry = self._queue.get(timeout=0.5)
            except queue.Empty:
                entry = False  # type: ignore[assignment]
            if self.failed:
                if entry is None:
                    return
                if entry:
                    self._not_archived(1)
                    if entry.done is not None:
                        entry.done(False)
                continue
            try:
                if entry is None:
                    self._rotate()
                    self._confirm()
                    return
                if entry:
                    self._write(entry)
                    if entry.done is not None:
                        self._waiting.append(entry.done)
                if self._waiting and (self._queue.empty() or len(self._waiting) >= 500):
                    self._confirm()
                if self._file is not None and time.monotonic() - self._opened >= self.file_age:
                    self._rotate()
                elif self.store.readable_while_open and time.monotonic() - self._last_index >= 1.0:
                    self._flush_index()
            except Exception as exc:  # a broken archive must not stop the crawl
                self._fail(exc, entry)
                if entry is None:
                    return

    def _confirm(self) -> None:
        """Tell the pages waiting (ARCHIVE_REQUIRED) that their records are on disk."""
        if self._file is not None:
            if self.store.readable_while_open:
                self._flush_index()
            else:
                self._file.flush()  # S3: in the local spool until the file is rotated and uploaded
        waiting, self._waiting = self._waiting, []
        for done in waiting:
            done(True)

    def _fail(self, exc: Exception, entry: Any) -> None:
        """Stops archiving for the rest of the run: said once, counted, the file cut back."""
        self.failed = True
        self.error = redact(str(exc))
        # Records written since the last index flush may be partly on disk: they are not
        # indexed, and the open file is cut back to its last indexed record where it can be.
        lost = len(self._unindexed) + (1 if self._pending else 0)
        self._unindexed = []
        if self._file is not None:
            try:
                self._file.close()
            except Exception:
                pass  # the buffer could not be written: exactly what is being given up
            if self.store.readable_while_open:
                try:
                    os.truncate(self.store.local_path(self._name), self._indexed_end)
                except OSError:
                    pass
            self._file = None
        logger.error(
            "Archive stopped: %s. The crawl goes on; pages from now on are not archived (stat archive/not_archived)",
            self.error,
        )
        if self.stats is not None:
            self.stats.inc_value("archive/errors")
            self.stats.set_value("archive/failed", 1)
        self._not_archived(lost)
        waiting, self._waiting = self._waiting, []
        if entry and entry.done is not None and entry.done not in waiting:
            waiting.append(entry.done)
        for done in waiting:
            done(False)

    def count_not_archived(self, count: int) -> None:
        """Pages the crawl did not hand to the archive because it had failed already."""
        self._not_archived(count)

    def _not_archived(self, count: int) -> None:
        self.not_archived += count
        if self.stats is not None and count:
            self.stats.inc_value("archive/not_archived", count)

    def _new_file(self, spider: str) -> None:
        now = datetime.now(UTC)
        self._seq += 1
        host = socket.gethostname().split(".")[0]
        self._name = (
            f"{spider}/{now:%Y/%m/%d}/{spider}-{now:%Y%m%dT%H%M%S}-{host}-{os.getpid()}-{self._seq:05d}.warc.gz"
        )
        self._file = open(self.store.local_path(self._name), "ab")
        self._opened = time.monotonic()
        self._indexed_end = 0

    def _rotate(self) -> None:
        if self._file is None:
            return
        self._file.close()
        self._file = None
        self.store.publish(self._name)
        self._flush_index()

    def _flush_index(self) -> None:
        self._last_index = time.monotonic()
        if not self._unindexed:
            return
        if self._file is not None:
            # Write, flush, then index: a row never names bytes still in this process' buffer.
            self._file.flush()
        with self._conn, self._conn.cursor() as cur:
            index.insert(cur, self._unindexed)
        self._unindexed = []
        if self._file is not None:
            self._indexed_end = self._file.tell()

    def _known(self, digest: str) -> tuple[str, datetime, str, int, int] | None:
        hit = self._digests.get(digest)
        if hit is not None:
            return hit
        with self._conn, self._conn.cursor() as cur:
            found = index.find_payload(cur, digest, self.retention_days, self.store.location)
        return tuple(found) if found else None  # type: ignore[return-value]

    def _write(self, e: Entry) -> None:
        self._pending = True
        if self._file is None:
            self._new_file(e.spider)
        digest = warc.payload_digest(e.body)
        earlier = self._known(digest)
        extra = {
            "WARC-Scraper-Target-URI": e.target_url,
            "WARC-Scraper-Spider": e.spider,
            "WARC-Scraper-Run": "" if e.run_id is None else str(e.run_id),
            "WARC-Scraper-Via": e.via,
            "WARC-Scraper-Provider": e.provider or "",
            "WARC-Scraper-Fingerprint": e.fingerprint,
        }
        data = warc.response_record(
            e.url,
            e.status,
            e.reason,
            e.headers,
            None if earlier else e.body,
            e.fetched_at,
            extra,
            refers_to=(earlier[0], earlier[1]) if earlier else None,
            digest=digest,
        )
        offset = self._file.tell()
        self._file.write(data)
        if earlier:
            payload = earlier[2:]
        else:
            payload = (self._name, offset, len(data))
            self._digests[digest] = (e.url, e.fetched_at, self._name, offset, len(data))
            if len(self._digests) > _DIGEST_CACHE:
                self._digests.popitem(last=False)
        self._unindexed.append(
            index.IndexRow(
                e.spider,
                e.run_id,
                redact(e.url),
                redact(e.target_url),
                e.fingerprint,
                e.fetched_at,
                e.status,
                e.via,
                e.provider,
                "revisit" if earlier else "response",
                self._name,
                offset,
                len(data),
                digest,
                payload[0],
                payload[1],
                payload[2],
                e.request,
                self.store.location,
            )
        )
        self._pending = False
        if self.stats is not None:
            self.stats.inc_value("archive/records")
            self.stats.inc_value("archive/revisits" if earlier else "archive/responses")
            self.stats.inc_value("archive/bytes", len(data))
        if self._file.tell() >= self.file_size:
            self._rotate()
