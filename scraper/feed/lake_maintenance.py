"""``scrapy feed compact``: the lake's small files rewritten, old snapshots and their files gone.

The relay commits every batch: each commit adds a data file to ``changes`` (per partition) and
rewrites part of ``current``, and leaves a snapshot, a manifest list and a metadata file. Readers
then open thousands of small files, and the bucket keeps every version forever. This rewrites
each partition of ``changes`` that has ``min_files`` files or more into one, ``current`` into one
file set, expires the snapshots older than ``keep_days`` (never the current one), and deletes the
files that only expired snapshots used. Files no snapshot ever used (a commit that failed after
writing them) are deleted once a day old, so that a relay's commit in flight keeps its files.

It runs beside a live relay: each rewrite is one Iceberg commit of the table's state as it was
read, and a commit the relay made in between fails it (optimistic concurrency); it is then read
again and retried.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from pyarrow.fs import FileSelector, FileType
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, EqualTo, GreaterThanOrEqual, IsNull, LessThan

from .sinks.lake import METADATA_PROPERTIES

ORPHAN_AGE = timedelta(days=1)
TRIES = 5


@dataclass
class TableReport:
    name: str
    files_before: int = 0
    files_after: int = 0
    rewritten: int = 0  # partitions (changes) or tables (current) rewritten
    expired: int = 0
    deleted: int = 0
    deleted_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"{self.name}: {self.files_before:,} data files -> {self.files_after:,} "
            f"({self.rewritten:,} rewritten), {self.expired:,} snapshots expired, "
            f"{self.deleted:,} files deleted ({self.deleted_bytes / 1e6:,.1f} MB)"
        )


def _partition_filter(partition: dict[str, Any]) -> BooleanExpression:
    spider = partition.get("spider")
    day = partition.get("at_day")
    by_spider = IsNull("spider") if spider is None else EqualTo("spider", spider)
    if day is None:
        return And(by_spider, IsNull("at"))
    start = datetime.combine(date(1970, 1, 1) + timedelta(days=int(day)), datetime.min.time(), UTC)
    return And(
        by_spider,
        And(GreaterThanOrEqual("at", start.isoformat()), LessThan("at", (start + timedelta(days=1)).isoformat())),
    )


def _day_number(value: Any) -> Any:
    # inspect.files() gives a day partition as a date; the filter above counts days since 1970.
    return (value - date(1970, 1, 1)).days if isinstance(value, date) else value


def _rewrite(load: Callable[[], Any], row_filter: BooleanExpression) -> bool:
    """The rows of *row_filter* written again as one overwrite; retried when a concurrent
    commit came first. False when nothing was there to rewrite."""
    for attempt in range(TRIES):
        table = load()
        rows = table.scan(row_filter=row_filter).to_arrow()
        if rows.num_rows == 0:
            return False
        try:
            with table.transaction() as tx:
                tx.overwrite(rows, overwrite_filter=row_filter)
            return True
        except CommitFailedException:
            if attempt == TRIES - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    return False


def _data_files(table: Any) -> list[dict[str, Any]]:
    return table.inspect.files().select(["file_path", "partition"]).to_pylist()


def compact(load: Callable[[], Any], name: str, min_files: int, report: TableReport) -> None:
    """Rewrite every partition of the table that *load* returns holding *min_files* or more."""
    files = _data_files(load())
    report.files_before = len(files)
    groups: dict[tuple, dict[str, Any]] = {}
    counts: dict[tuple, int] = {}
    for f in files:
        part = {k: _day_number(v) if k == "at_day" else v for k, v in (f["partition"] or {}).items()}
        key = tuple(sorted(part.items()))
        groups[key] = part
        counts[key] = counts.get(key, 0) + 1
    for key, part in groups.items():
        if counts[key] < min_files:
            continue
        if _rewrite(load, _partition_filter(part) if part else AlwaysTrue()):
            report.rewritten += 1
    report.files_after = len(_data_files(load()))


def _referenced(table: Any) -> set[str]:
    """Every file some snapshot of *table* uses, and its metadata files."""
    meta = table.metadata
    used = {table.metadata_location, *(entry.metadata_file for entry in meta.metadata_log)}
    for snapshot in meta.snapshots:
        used.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            used.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                used.add(entry.data_file.file_path)
    for stats in meta.statistics:
        used.add(stats.statistics_path)
    return used


def expire(load: Callable[[], Any], keep_days: float, report: TableReport, now: datetime | None = None) -> None:
    """Expire snapshots older than *keep_days* and delete the files nothing uses any more."""
    now = now or datetime.now(UTC)
    table = load()
    before = _referenced(table)
    snapshots = len(table.metadata.snapshots)
    for attempt in range(TRIES):
        try:
            missing = {k: v for k, v in METADATA_PROPERTIES.items() if table.properties.get(k) != v}
            if missing:
                with table.transaction() as tx:
                    tx.set_properties(missing)
                table = load()
            table.maintenance.expire_snapshots().older_than(now - timedelta(days=keep_days)).commit()
            break
        except CommitFailedException:
            if attempt == TRIES - 1:
                raise
            table = load()
            before = _referenced(table)
            snapshots = len(table.metadata.snapshots)
    table = load()
    report.expired = max(snapshots - len(table.metadata.snapshots), 0)
    after = _referenced(table)
    io = table.io
    scheme, netloc, root = io.parse_location(table.location(), io.properties)
    fs = io.fs_by_scheme(scheme, netloc)

    def path_of(location: str) -> str:
        return io.parse_location(location, io.properties)[2]

    dropped = {path_of(x) for x in before - after}
    kept = {path_of(x) for x in after}
    for info in fs.get_file_info(FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type != FileType.File or info.path in kept:
            continue
        mtime = info.mtime
        if mtime is not None and mtime.tzinfo is None:
            mtime = mtime.replace(tzinfo=UTC)
        orphan_old = mtime is not None and now - mtime > ORPHAN_AGE
        if info.path in dropped or orphan_old:
            fs.delete_file(info.path)
            report.deleted += 1
            report.deleted_bytes += info.size or 0
