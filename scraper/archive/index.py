"""The archive's index in Postgres: every version of every page, and where its bytes are.

``file``/``record_offset``/``record_length`` locate the record itself; ``payload_*`` locate the
record holding the body, which for a revisit (an identical body seen before) is the earlier
response record. Prune keeps every file some kept row points at, either way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg2.extras import execute_values

from ..storage.schema import existing_columns

DDL = """
CREATE TABLE IF NOT EXISTS archive_index (
    id              bigserial PRIMARY KEY,
    spider          text NOT NULL,
    run_id          bigint,
    url             text NOT NULL,
    target_url      text NOT NULL,
    fingerprint     text NOT NULL,
    fetched_at      timestamptz NOT NULL,
    status          integer NOT NULL,
    via             text NOT NULL,
    provider        text,
    record_type     text NOT NULL,
    file            text NOT NULL,
    record_offset   bigint NOT NULL,
    record_length   bigint NOT NULL,
    digest          text NOT NULL,
    payload_file    text NOT NULL,
    payload_offset  bigint NOT NULL,
    payload_length  bigint NOT NULL,
    request         jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS archive_index_spider_idx ON archive_index (spider, fetched_at);
CREATE INDEX IF NOT EXISTS archive_index_url_idx ON archive_index (url, fetched_at);
CREATE INDEX IF NOT EXISTS archive_index_fp_idx ON archive_index (fingerprint, fetched_at);
CREATE INDEX IF NOT EXISTS archive_index_digest_idx ON archive_index (digest, fetched_at);
CREATE INDEX IF NOT EXISTS archive_index_file_idx ON archive_index (file);
CREATE INDEX IF NOT EXISTS archive_index_payload_file_idx ON archive_index (payload_file);
"""
# The archive (a folder on a host, or a bucket) holding the row's files: a revisit points only at
# a body in its own archive. Rows indexed before it was recorded have none. Added only where it is
# missing: ALTER TABLE locks the table even when it has nothing to do.
ADD_ARCHIVE = "ALTER TABLE archive_index ADD COLUMN IF NOT EXISTS archive text"
_LOCK = 0x5C12A9E6


@dataclass
class IndexRow:
    spider: str
    run_id: int | None
    url: str
    target_url: str
    fingerprint: str
    fetched_at: datetime
    status: int
    via: str
    provider: str | None
    record_type: str
    file: str
    record_offset: int
    record_length: int
    digest: str
    payload_file: str
    payload_offset: int
    payload_length: int
    request: dict[str, Any]
    archive: str | None = None  # the Store's location


def ensure(conn: Any) -> None:
    with conn, conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
        cur.execute(DDL)
        if "archive" not in existing_columns(cur, "archive_index"):
            cur.execute(ADD_ARCHIVE)


def insert(cur: Any, rows: list[IndexRow]) -> None:
    execute_values(
        cur,
        "INSERT INTO archive_index (spider, run_id, url, target_url, fingerprint, fetched_at, status, via,"
        " provider, record_type, file, record_offset, record_length, digest, payload_file, payload_offset,"
        " payload_length, request, archive) VALUES %s",
        [
            (
                r.spider,
                r.run_id,
                r.url,
                r.target_url,
                r.fingerprint,
                r.fetched_at,
                r.status,
                r.via,
                r.provider,
                r.record_type,
                r.file,
                r.record_offset,
                r.record_length,
                r.digest,
                r.payload_file,
                r.payload_offset,
                r.payload_length,
                json.dumps(r.request),
                r.archive,
            )
            for r in rows
        ],
    )


def find_payload(cur: Any, digest: str, retention_days: float, archive: str) -> tuple | None:
    """An earlier response with this body in *archive*, still inside the retention window:
    (url, fetched_at, file, offset, length)."""
    cur.execute(
        "SELECT url, fetched_at, file, record_offset, record_length FROM archive_index"
        " WHERE digest = %s AND record_type = 'response' AND archive = %s"
        " AND fetched_at > now() - make_interval(secs => %s) ORDER BY fetched_at DESC LIMIT 1",
        (digest, archive, retention_days * 86400 / 2),
    )
    return cur.fetchone()
