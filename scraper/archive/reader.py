"""Archived records read in batches: one read per run of neighbouring records, not one per page.

A replay reads its records in index order, which is mostly the order they were written in: a
batch of them lies in a few stretches of a few files. Each stretch is read once (one system
call, or one ranged GET from a bucket instead of one per page) and every record, and every
revisit's payload, is cut out of it. A stretch that cannot be read whole (a file pruned or cut
short since the index was read) is read record by record instead, so a damaged record fails
exactly as it did read alone, and its neighbours still read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from . import warc
from .store import Store

# Bytes between two records below which they are read as one stretch (a record is ~1.3 KB
# gzipped; a gap is usually another spider's or an older version's records).
MAX_GAP = 64 * 1024
# A stretch is at most this long: memory stays bounded whatever the archive's layout.
MAX_STRETCH = 8 * 1024 * 1024

Loaded = tuple[int, list[tuple[str, str]], bytes]


def _stretches(ranges: Iterable[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """Each file's ranges merged into (file, start, end) stretches."""
    out: list[tuple[str, int, int]] = []
    for name, start, end in sorted(set(ranges)):
        if out and out[-1][0] == name and start - out[-1][2] <= MAX_GAP and end - out[-1][1] <= MAX_STRETCH:
            last = out[-1]
            out[-1] = (name, last[1], max(last[2], end))
        else:
            out.append((name, start, end))
    return out


class _Bytes:
    """The bytes of a batch's stretches; a range outside them (or of a stretch read short) is
    read alone, as an unbatched replay reads it."""

    def __init__(self, store: Store, stretches: list[tuple[str, int, int]]) -> None:
        self.store = store
        self.held: dict[str, list[tuple[int, bytes]]] = {}
        for name, start, end in stretches:
            try:
                data = store.read(name, start, end - start)
            except Exception:  # the records of this stretch fail (or not) one by one below
                continue
            self.held.setdefault(name, []).append((start, data))

    def read(self, name: str, offset: int, length: int) -> bytes:
        for start, data in self.held.get(name, ()):
            if start <= offset and offset + length <= start + len(data):
                return data[offset - start : offset - start + length]
        return self.store.read(name, offset, length)


def load_batch(store: Store, records: list[Any], parse: Callable[[Any, Any], Loaded]) -> list[Loaded | Exception]:
    """Each record's (status, headers, body), or the exception reading it raised, in order;
    *parse(reader, record)* reads one record through *reader*'s ``read``."""
    ranges = []
    for r in records:
        ranges.append((r.file, r.record_offset, r.record_offset + r.record_length))
        if r.payload_file != r.file or r.payload_offset != r.record_offset:
            ranges.append((r.payload_file, r.payload_offset, r.payload_offset + r.payload_length))
    held = _Bytes(store, _stretches(ranges))
    out: list[Loaded | Exception] = []
    for record in records:
        try:
            out.append(parse(held, record))
        except Exception as exc:  # reported by the replay's downloader middleware, per page
            out.append(exc)
    return out


def parse_record(reader: Any, record: Any) -> Loaded:
    """Status, headers and body of *record*; a revisit's body comes from the record it points at."""
    kind, status, headers, body = warc.read_record(reader.read(record.file, record.record_offset, record.record_length))
    if kind == "revisit":
        _, _, _, body = warc.read_record(reader.read(record.payload_file, record.payload_offset, record.payload_length))
    return status, headers, body
