"""The quality record of each checked run in Postgres.

``run_quality``: one row per run that was checked, with its outcome (``ok`` or ``degraded``),
the fields and currencies its failed checks name (``affected``), the runs it was compared with
and its summed quality figures, which later runs read as their
baseline (Redis keeps a run's figures a week; a baseline may be older). ``run_checks``: one row
per check of that run (check, subject, expected, observed, passed; passed is null when the check
was skipped, with the reason in ``note``). Only runs that finished normally are checked, so a
stopped or discarded run is never anyone's baseline.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg2

from .checks import Check
from .report import affected

DDL = """
CREATE TABLE IF NOT EXISTS run_quality (
    spider    text NOT NULL,
    run_id    integer NOT NULL,
    outcome   text NOT NULL,
    baseline  integer[] NOT NULL DEFAULT '{}',
    figures   jsonb NOT NULL,
    checked   timestamptz NOT NULL DEFAULT now(),
    affected  text[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (spider, run_id)
);
CREATE TABLE IF NOT EXISTS run_checks (
    spider    text NOT NULL,
    run_id    integer NOT NULL,
    position  integer NOT NULL,
    "check"   text NOT NULL,
    subject   text NOT NULL DEFAULT '',
    expected  text NOT NULL DEFAULT '',
    observed  text NOT NULL DEFAULT '',
    passed    boolean,
    note      text NOT NULL DEFAULT '',
    PRIMARY KEY (spider, run_id, position)
);
"""
_LOCK = 0x5C12A9E7  # serialises concurrent first creations of the tables


def connect(dsn: str) -> Any:
    conn = psycopg2.connect(dsn, connect_timeout=10, application_name="scraper:quality")
    ensure_tables(conn)
    return conn


def ensure_tables(conn: Any) -> None:
    with conn, conn.cursor() as cur:
        cur.execute(
            "SELECT to_regclass('run_checks') IS NOT NULL, EXISTS (SELECT 1 FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = 'run_quality' AND column_name = 'affected')"
        )
        tables, has_affected = cur.fetchone()
        if not tables or not has_affected:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
            cur.execute(DDL)
            # Tables made before the column: the fields a failed check affects, queryable.
            cur.execute("ALTER TABLE run_quality ADD COLUMN IF NOT EXISTS affected text[] NOT NULL DEFAULT '{}'")


def save(
    conn: Any,
    spider: str,
    run_id: int,
    outcome: str,
    baseline: list[int],
    figures: dict[str, float],
    checks: list[Check],
) -> None:
    """Write the run's outcome and checks, replacing those of an earlier check of the same run."""
    ensure_tables(conn)
    with conn, conn.cursor() as cur:
        cur.execute(
            "INSERT INTO run_quality (spider, run_id, outcome, baseline, figures, affected) "
            "VALUES (%s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (spider, run_id) DO UPDATE SET outcome = EXCLUDED.outcome, baseline = EXCLUDED.baseline, "
            "figures = EXCLUDED.figures, affected = EXCLUDED.affected, checked = now()",
            (spider, run_id, outcome, baseline, json.dumps(figures), affected(checks)),
        )
        cur.execute("DELETE FROM run_checks WHERE spider = %s AND run_id = %s", (spider, run_id))
        for position, c in enumerate(checks):
            cur.execute(
                'INSERT INTO run_checks (spider, run_id, position, "check", subject, expected, observed, passed, note) '
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (spider, run_id, position, c.check, c.subject, c.expected, c.observed, c.passed, c.note),
            )


def baseline(
    conn: Any, spider: str, before: int, limit: int, revisit: bool = False
) -> list[tuple[int, dict[str, float]]]:
    """The figures of the spider's last *limit* checked runs before run *before*, newest first:
    revisit runs (``scrapy crawl --due``) when *revisit*, else full runs. A revisit run visits a
    part of the site, so a full run's counts are no measure for it, nor the other way round; the
    first revisit runs take the full runs' shares (coverage, rejects), the checks of counts
    compare like with like (see :mod:`.checks`)."""
    ensure_tables(conn)
    with conn, conn.cursor() as cur:
        for kind in (revisit, False) if revisit else (False,):
            cur.execute(
                "SELECT run_id, figures FROM run_quality WHERE spider = %s AND run_id < %s "
                "AND (coalesce((figures->>'run/revisit')::float, 0) > 0) = %s ORDER BY run_id DESC LIMIT %s",
                (spider, before, kind, limit),
            )
            found = [(run_id, {k: float(v) for k, v in figures.items()}) for run_id, figures in cur.fetchall()]
            if found:
                return found
        return []


def report(conn: Any, spider: str, run_id: int) -> tuple[dict[str, Any], list[Check]] | None:
    """The run's outcome row and its checks, or None if it was not checked."""
    ensure_tables(conn)
    with conn, conn.cursor() as cur:
        cur.execute(
            "SELECT outcome, baseline, checked FROM run_quality WHERE spider = %s AND run_id = %s", (spider, run_id)
        )
        row = cur.fetchone()
        if row is None:
            return None
        cur.execute(
            'SELECT "check", subject, expected, observed, passed, note FROM run_checks '
            "WHERE spider = %s AND run_id = %s ORDER BY position",
            (spider, run_id),
        )
        checks = [Check(*r) for r in cur.fetchall()]
    return {"spider": spider, "run_id": run_id, "outcome": row[0], "baseline": list(row[1]), "checked": row[2]}, checks


def last_outcome(conn: Any, spider: str, before: int) -> tuple[int, str, int] | None:
    """(run id, outcome, failed checks) of the spider's last checked run before run *before*."""
    with conn, conn.cursor() as cur:
        cur.execute(
            "SELECT q.run_id, q.outcome, (SELECT count(*) FROM run_checks c WHERE c.spider = q.spider "
            "AND c.run_id = q.run_id AND c.passed = false) FROM run_quality q "
            "WHERE q.spider = %s AND q.run_id < %s ORDER BY q.run_id DESC LIMIT 1",
            (spider, before),
        )
        row = cur.fetchone()
    return (int(row[0]), row[1], int(row[2])) if row else None


def outcomes(conn: Any, spider: str) -> dict[int, str]:
    """Run id -> outcome of the spider's checked runs."""
    ensure_tables(conn)
    with conn, conn.cursor() as cur:
        cur.execute("SELECT run_id, outcome FROM run_quality WHERE spider = %s", (spider,))
        return dict(cur.fetchall())


def gone_column(conn: Any, spider: str, run_id: int) -> float | None:
    """The run's ``gone`` figure if ``crawl_runs`` records one (rows that vanished in that run)."""
    with conn, conn.cursor() as cur:
        cur.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_name = 'crawl_runs' "
            "AND column_name = 'gone' AND table_schema = current_schema()"
        )
        if cur.fetchone() is None:
            return None
        cur.execute("SELECT gone FROM crawl_runs WHERE spider = %s AND run_id = %s", (spider, run_id))
        row = cur.fetchone()
    return float(row[0]) if row and row[0] is not None else None
