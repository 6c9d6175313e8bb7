"""What ``scrapy runs SPIDER --apply/--discard/--revert RUN`` do, and the held part of ``--report``.

Each acts on stored data in one transaction and says what it did in one line. None acts on a
run that is still going: its nodes would write on top of it.
"""

from __future__ import annotations

import sys
from typing import Any

import psycopg2

from ..backends.redis_client import get_redis
from ..config import get_float
from ..items import StoredItem, stored_item_types
from ..quality.settings import read_settings, value_shifts
from ..queue import keys
from ..runs.nodes import NodeRegistry
from ..storage import held, retention, revert


def failing_values(conn: Any, settings: Any, spider: str, run_id: int) -> list[str]:
    """What applying run *run_id*'s held changes would write that the run's pair checks fail:
    one line per field whose held values moved, against the stored rows, in more than
    ``QUALITY_PRICE_JUMPS`` of the pairs."""
    conf = read_settings(settings)
    out = []
    for item_type in stored_item_types():
        shifts = value_shifts(item_type, conf.price_shift)
        for name, (pairs, moved) in sorted(held.value_moves(conn, spider, run_id, [item_type], shifts).items()):
            field = name.split(".", 1)[1]
            if pairs and moved / pairs > conf.price_jumps + 1e-9:
                out.append(
                    f"{name}: {moved} of {pairs} held values moved by more than {shifts[field]:.0%} from the "
                    f"stored ones ({moved / pairs:.0%}, the pair check allows {conf.price_jumps:.0%})"
                )
    return out


def held_report(conn: Any, spider: str, run_id: int, shown: int = 20, settings: Any = None) -> list[str]:
    """The lines ``--report`` adds for a run that holds changes (none when it holds nothing)."""
    counts = held.summary(conn, spider, run_id)
    if not counts:
        return []
    lines = [
        f"Held by run {run_id} (its quality broke): {counts.get('item', 0)} item change(s), "
        f"{counts.get('value', 0)} waiting value change(s), "
        f"{counts.get('gone', 0)} gone-mark(s); stored rows keep their values until "
        f"`scrapy runs {spider} --apply {run_id}` or `--discard {run_id}`"
    ]
    if settings is not None:
        for line in failing_values(conn, settings, spider, run_id):
            lines.append(f"  would fail: {line}: --apply refuses them without --force")
    listed = held.listed(conn, spider, run_id, shown)
    for entry in listed:
        key = ", ".join(map(str, entry.key))
        lines.append(f"  {entry.kind:4}  {entry.item_table} [{key}]  {entry.url or ''}  {entry.reasons}".rstrip())
    total = sum(counts.values())
    if total > len(listed):
        lines.append(f"  ... and {total - len(listed)} more (held_changes, spider = {spider!r}, run_id = {run_id})")
    return lines


def _running(server: Any, spider: str, run_id: int, node_ttl: float) -> bool:
    raw = {k.decode(): v.decode() for k, v in server.hgetall(keys.run_key(spider)).items()}
    if raw.get("id") != str(run_id) or raw.get("state", "running") != "running":
        return False
    return bool(NodeRegistry(server, keys.nodes_key(spider), ttl=node_ttl).live())


def _types_of(conn: Any, spider: str, run_id: int, table: str) -> tuple[list[type[StoredItem]], list[str]]:
    """The item types whose tables run *run_id* touched (in *table*), and the tables no item type
    of this project declares (their changes cannot be written back)."""
    with conn, conn.cursor() as cur:
        held.ensure(cur)
        cur.execute(f"SELECT DISTINCT item_table FROM {table} WHERE spider = %s AND run_id = %s", (spider, run_id))
        tables = sorted(r[0] for r in cur.fetchall())
    declared = {t.table: t for t in stored_item_types()}
    return [declared[t] for t in tables if t in declared], [t for t in tables if t not in declared]


def act(found: Any, settings: Any, spider: str, action: str, run_id: int, force: bool = False) -> int:
    """Apply, discard or revert run *run_id* of *spider*; the exit status."""
    server = get_redis(found.redis_url)
    if _running(server, spider, run_id, get_float(settings, "RUNS_NODE_TTL", 60.0, minimum=1)):
        print(
            f"error: run {run_id} of {spider} is still running: --{action} acts on a run once it is over",
            file=sys.stderr,
        )
        return 2
    conn = psycopg2.connect(found.database_url, connect_timeout=10, application_name=f"scraper:runs-{action}")
    try:
        if action == "discard":
            dropped = held.discard(conn, spider, run_id)
            print(
                f"run {run_id} of {spider}: {dropped} held change(s) dropped; stored rows and the history "
                "are as they were"
            )
            return 0
        source = "held_changes" if action == "apply" else "item_changes"
        types, unknown = _types_of(conn, spider, run_id, source)
        if unknown:
            print(
                f"error: run {run_id} of {spider} touched table(s) {', '.join(unknown)} that no item type of "
                "this project declares (load the spider that stores them)",
                file=sys.stderr,
            )
            return 2
        if action == "apply":
            if not held.summary(conn, spider, run_id):
                print(f"run {run_id} of {spider} holds no changes: nothing to apply")
                return 0
            failing = failing_values(conn, settings, spider, run_id)
            if failing and not force:
                print(
                    f"error: run {run_id} of {spider} holds values that fail its checks; applying would store them:\n  "
                    + "\n  ".join(failing)
                    + f"\n--discard {run_id} drops them; --apply {run_id} --force writes them all the same",
                    file=sys.stderr,
                )
                return 1
            if failing:
                print("warning: writing values that fail the run's checks (--force):\n  " + "\n  ".join(failing))
            done = held.apply(conn, spider, run_id, types)
            print(
                f"run {run_id} of {spider}: {done.upserted} row(s) written, {done.gone} marked gone, "
                f"{done.superseded} held change(s) dropped because a later run saw the row since"
            )
            return 0
        if held.summary(conn, spider, run_id):
            print(
                f"error: run {run_id} of {spider} holds changes: --apply or --discard them first, then revert",
                file=sys.stderr,
            )
            return 2

        def progress(done: int, total: int) -> None:
            print(f"  reverting: {done} of {total} rows", file=sys.stderr)

        try:
            reverted = revert.revert_run(conn, spider, run_id, types, progress)
        except (revert.AlreadyReverted, retention.RetentionError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"run {run_id} of {spider} reverted: {reverted}")
        return 0
    finally:
        conn.close()
