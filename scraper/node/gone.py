"""Gone rows: when a run finishes, rows of its spider it did not see get ``gone_at``.

"Seen in the run" is what the dedupe pipeline claimed in Redis during the run (every entity
every node stored, one field per natural key), not ``last_seen``, which is refreshed only
every ``POSTGRES_LAST_SEEN_RESOLUTION`` to keep unchanged rows free. The claims are hashed
(sha1 of the table and key values); the same hash is computed over the spider's row keys.

Only the last node out of a finished run marks anything, once, and only when the run
completed (see :mod:`scraper.runs_hook`) and most of its pages did not fail: a run cut
short would mark the whole unseen rest of the site gone. A run whose live quality guard broke
(see :mod:`scraper.quality.guard`) holds its gone-marks with the run instead (unless
``QUALITY_ON_BREAK=continue``): a layout break hides live rows. A row seen again later is upserted
with ``gone_at`` cleared and a ``back`` history entry (see :mod:`scraper.storage.upsert`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Iterable
from typing import Any

import psycopg2
from psycopg2 import sql
from psycopg2.extras import execute_values

from ..items.base import StoredItem
from ..queue.keys import REVISIT_DUE_FIELD, items_seen_key, revisit_expected_key
from ..runs.state import summed_figures
from ..runs_hook import current_run_id, run_finished
from ..storage import held
from ..storage.history import key_match
from ..storage.owner import existing_writer

logger = logging.getLogger(__name__)


def key_digest(table: str, key: Iterable[Any]) -> str:
    """The dedupe pipeline's claim for an entity (see :mod:`scraper.pipelines.dedupe`)."""
    return hashlib.sha1("\0".join([table, *(str(v) for v in key)]).encode("utf-8")).hexdigest()


def _unseen(
    conn: Any, spider: str, item_type: type[StoredItem], seen: set[str], only: set[str] | None = None
) -> list[tuple[Any, ...]]:
    """The keys of the *spider*'s live rows whose digest is not in *seen* (and is in *only*, a
    revisit run's expected items, when given).

    The digests are compared here rather than in SQL: Postgres has no built-in sha1. Only the
    keys of the spider's current rows are read, by a server-side cursor."""
    ident = sql.Identifier
    keys = sql.SQL(", ").join(map(ident, item_type.key))
    with conn.cursor(name="gone_keys") as rows:
        rows.itersize = 10_000
        rows.execute(
            sql.SQL("SELECT {} FROM {} WHERE spider = %s AND gone_at IS NULL").format(keys, ident(item_type.table)),
            (spider,),
        )
        if only is None:
            return [tuple(r) for r in rows if key_digest(item_type.table, r) not in seen]
        return [tuple(r) for r in rows if (d := key_digest(item_type.table, r)) in only and d not in seen]


def hold_gone(
    conn: Any,
    spider: str,
    item_types: Iterable[type[StoredItem]],
    seen: Iterable[str],
    run_id: int,
    only: set[str] | None = None,
) -> int:
    """What :func:`mark_gone` would mark, held with the run instead (see :mod:`.held`)."""
    seen = set(seen)
    total = 0
    with conn, conn.cursor() as cur:
        held.ensure(cur)
        for item_type in item_types:
            total += held.hold_gone(cur, spider, run_id, item_type, _unseen(conn, spider, item_type, seen, only))
    return total


def mark_gone(
    conn: Any,
    spider: str,
    item_types: Iterable[type[StoredItem]],
    seen: Iterable[str],
    run_id: int | None,
    only: set[str] | None = None,
) -> int:
    """Mark the *spider*'s rows whose key digest is not in *seen* (and is in *only*, when given);
    returns how many."""
    seen = set(seen)
    total = 0
    with conn, conn.cursor() as cur:
        for item_type in item_types:
            ident = sql.Identifier
            missing = _unseen(conn, spider, item_type, seen, only)
            if not missing:
                continue
            cur.execute("CREATE TEMP TABLE IF NOT EXISTS _gone_keys (key jsonb) ON COMMIT DROP")
            execute_values(
                cur, "INSERT INTO _gone_keys (key) VALUES %s", [(json.dumps(list(k), default=str),) for k in missing]
            )
            match = key_match(item_type, "t", "g.key")
            cur.execute(
                sql.SQL(
                    """
                WITH g AS (
                    UPDATE {table} t SET gone_at = now() FROM _gone_keys g
                    WHERE {match} AND t.spider = %(spider)s AND t.gone_at IS NULL
                    RETURNING g.key
                )
                INSERT INTO item_changes (item_table, key, kind, reason, spider, run_id)
                SELECT %(table)s, g.key, 'gone', 'crawl', %(spider)s, %(run)s FROM g
                """
                ).format(table=ident(item_type.table), match=match),
                {"spider": spider, "table": item_type.table, "run": run_id},
            )
            total += cur.rowcount
            cur.execute("DELETE FROM _gone_keys")
    return total


def hold_items_seen(crawler: Any, spider: str, run_keys: list[str]) -> dict[str, str]:
    """The run keys gone-marking reads (the items claimed, a revisit's expected items), when this
    crawl stores items: each with the name the run's finish renames it to, in the same script
    that finishes the run (see :func:`after_leave`); the finish drops the others."""
    if existing_writer(crawler) is None:
        return {}
    token = uuid.uuid4().hex[:8]
    kept = (items_seen_key(spider), revisit_expected_key(spider))
    return {k: f"{k}:closing:{token}" for k in run_keys if k in kept}


def _run_broke(crawler: Any, server: Any, spider: str) -> list[str]:
    """The fields ("Type.field") whose coverage the live guard found broken in this run,
    fleet-wide: a layout break hides live rows, which must not be marked gone."""
    from ..quality.breaks import run_break

    found_here = [f for f in (crawler.stats.get_value("quality/broken_fields") or "").split(",") if f]
    try:
        found = run_break(server, spider, current_run_id(crawler) or 0)
    except Exception:  # cannot tell: then the run may have broken, and gone-marking waits
        return found_here or ["(its quality record could not be read)"]
    return sorted(set(found) | set(found_here))


def _restore(crawler: Any, writer: Any, spider: str, broken: list[str]) -> None:
    """Put back the values the run blanked before its guard saw the break."""
    from ..quality.restore import restore_blanks

    run_id = current_run_id(crawler)
    if not run_id:
        return
    conn = psycopg2.connect(writer.dsn)
    try:
        restored = restore_blanks(
            conn, spider, run_id, list(writer._types.values()), [b for b in broken if "/" not in b]
        )
    finally:
        conn.close()
    crawler.stats.set_value("quality/restored", restored)
    if restored:
        logger.warning("Run of %r: %d value(s) blanked before the guard saw the break written back", spider, restored)


def _mostly_failed(crawler: Any, server: Any, spider: str) -> bool:
    """The run fetched too little to tell what left the site: judged by every node's figures (a
    node that joined late and fetched nothing may be the last out), this node's own when Redis
    has none."""
    stats = crawler.stats
    responses = stats.get_value("response_received_count", 0)
    failed = stats.get_value("dead_letters/count", 0)
    try:
        fleet, _nodes = summed_figures(server, spider, int(current_run_id(crawler) or 0))
    except Exception as exc:  # this node's own figures then
        logger.warning("Could not read the run's figures of %r: %s", spider, exc)
        fleet = {}
    if fleet:
        responses = max(responses, fleet.get("response_received_count", 0))
        failed = max(failed, fleet.get("dead_letters/count", 0))
    failed += stats.get_value("downloader/exception_count", 0)
    return responses == 0 or failed > responses


def after_leave(crawler: Any, server: Any, spider: str, reason: str, last_out: bool, held: dict[str, str]) -> None:
    """Called by the scheduler once this node left the run. The last node out of a finished run
    reads the run's item claims, which the finish renamed out of the run's way (*held*, see
    :func:`hold_items_seen`: a next run starts with a fresh hash, and one that begins at once
    cannot drop them first), and marks what they lack gone."""
    writer = existing_writer(crawler)
    if writer is None or not last_out:
        return
    taken = _closing(server, held.get(items_seen_key(spider)))
    expected = _closing(server, held.get(revisit_expected_key(spider)))
    try:
        if not run_finished(crawler, reason):
            logger.info("Run of %r did not finish (%s): nothing is marked gone", spider, reason)
            return
        broken = _run_broke(crawler, server, spider)
        holding = bool(broken) and (crawler.settings.get("QUALITY_ON_BREAK") or "hold").strip().lower() != "continue"
        if holding:
            _restore(crawler, writer, spider, broken)
        only = _revisited(server, expected)
        if only is not None and not only:
            logger.info("Revisit run of %r visited no page that had items: nothing to mark gone", spider)
            return
        # A revisit run that saw nothing may still have expected items (pages answering 404).
        if (taken is None and only is None) or _mostly_failed(crawler, server, spider):
            logger.warning("Run of %r fetched too little of the site: nothing is marked gone", spider)
            return
        if only is not None:
            logger.info(
                "Revisit run of %r: gone-marking covers the %d item(s) of the pages it visited", spider, len(only)
            )
        # A thousand claims per round trip: Redis' default of ten made the last node's close
        # one round trip per ten items stored (460 for the 5,000-product demo shop).
        seen = (
            field.decode() if isinstance(field, bytes) else field
            for field, _ in (server.hscan_iter(taken, count=1000) if taken is not None else ())
        )
        run_id = current_run_id(crawler)
        conn = psycopg2.connect(writer.dsn)
        try:
            if holding:
                kept = hold_gone(conn, spider, list(writer._types.values()), seen, run_id or 0, only)
            else:
                gone = mark_gone(conn, spider, list(writer._types.values()), seen, run_id, only)
        finally:
            conn.close()
        if holding:
            crawler.stats.set_value("quality/held_gone", kept)
            logger.warning(
                "Run of %r broke its data quality (%s): nothing is marked gone; %d gone-mark(s) held "
                "with run %s (scrapy runs %s --report %s, then --apply or --discard)",
                spider,
                ", ".join(broken),
                kept,
                run_id,
                spider,
                run_id,
            )
            return
        crawler.stats.set_value("items/gone", gone)
        logger.info("Run of %r finished: %d row(s) not seen in it marked gone", spider, gone)
    except Exception as exc:
        logger.error("Could not mark the rows of %r gone: %s", spider, exc)
    finally:
        for key in (taken, expected):
            if key is not None:
                server.delete(key)


def _closing(server: Any, name: str | None) -> str | None:
    """*name*, a key the run's finish renamed, if it exists (nothing claimed: it does not)."""
    return name if name is not None and server.exists(name) else None


def _revisited(server: Any, expected: str | None) -> set[str] | None:
    """A revisit run's expected items (see :mod:`scraper.revisit.recorder`), or None for a run that
    meant to visit every page."""
    if expected is None:
        return None
    fields = {f.decode() if isinstance(f, bytes) else f for f, _ in server.hscan_iter(expected, count=1000)}
    if REVISIT_DUE_FIELD not in fields:
        return None
    return fields - {REVISIT_DUE_FIELD}
