"""``scrapy runs [spider...]``: the runs of each spider, their state and figures.

Rows come from the ``crawl_runs`` table; the current run of each spider is completed from
Redis (its state as the fleet sees it now, and its figures summed over its nodes), so a run in
progress shows its live numbers. ``--json`` prints one object per run, ``--limit`` the number
of runs per spider (20). The ``quality`` column is the outcome of a finished run's data-quality
checks (``ok``, ``degraded``); ``scrapy runs SPIDER --report RUN`` prints that run's report and
the changes it held when its quality broke, ``--apply RUN`` writes them, ``--discard RUN`` drops
them and ``--revert RUN`` undoes what a finished run changed (see :mod:`.run_changes`).
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from argparse import ArgumentParser, Namespace
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from ..backends.redis_client import get_redis
from ..config import get_float
from ..quality import report as quality_report
from ..quality import store as quality_store
from ..queue import keys
from ..runs import record
from ..runs.cost import cost as run_cost
from ..runs.nodes import NodeRegistry
from ..runs.state import summed_figures
from . import backends_or_report
from . import run_changes as changes

SHOWN = [
    ("run", "run_id"),
    ("state", "state"),
    ("started", "started"),
    ("took", "took"),
    ("nodes", "nodes_seen"),
    ("pages", "pages"),
    ("new", "items_new"),
    ("updated", "items_updated"),
    ("same", "items_unchanged"),
    ("rejected", "items_rejected"),
    ("dupes", "duplicates"),
    ("dead", "dead_letters"),
    ("credits", "api_credits"),
    # Credits per change through a scraping API, else pages per change (the cost of a recrawl).
    ("per chg", "per_change"),
    ("redeliv", "redeliveries"),
    ("throttled", "throttled"),
    ("unarchived", "not_archived"),
    ("quality", "quality"),
]


def current_run(server: Any, spider: str, node_ttl: float) -> dict[str, Any] | None:
    """The spider's current run as Redis has it, with live state and summed figures."""
    raw = {k.decode(): v.decode() for k, v in server.hgetall(keys.run_key(spider)).items()}
    if not raw.get("id"):
        return None
    run_id = int(raw["id"])
    figures, nodes = summed_figures(server, spider, run_id)
    live = NodeRegistry(server, keys.nodes_key(spider), ttl=node_ttl).live()
    state = raw.get("state", "running")
    if state == "running" and not live:
        state = "stopped"  # its nodes are gone; the next start resumes or finishes it
    row = {
        "spider": spider,
        "run_id": run_id,
        "state": state,
        "live_nodes": len(live),
        "started": record._ts(raw.get("started")),
        "finished": record._ts(raw.get("finished")),
        "finish_reason": raw.get("reason") if state != "running" else None,
        "nodes_seen": nodes,
    }
    row.update(
        {
            column: figures.get(stat, 0) if column == "api_credits" else int(figures.get(stat, 0))
            for column, stat in record.FIGURES.items()
        }
    )
    return row


def merged_runs(server: Any, conn: Any, spiders: list[str], node_ttl: float, limit: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for spider in spiders:
        recorded = record.runs(conn, spider, limit) if conn is not None else []
        current = current_run(server, spider, node_ttl)
        if current is not None:
            recorded = [r for r in recorded if r["run_id"] != current["run_id"]]
            if current["started"] is None and recorded:
                current["started"] = recorded[0]["started"]
            recorded.insert(0, current)
        rows.extend(sorted(recorded, key=lambda r: -r["run_id"])[:limit])
    return rows


def cost(row: dict[str, Any]) -> dict[str, Any]:
    """What the run's changes cost: changes captured (rows new or updated), and pages fetched and
    scraping-API credits spent per change (None without a change)."""
    found = run_cost(
        row.get("items_new") or 0,
        row.get("items_updated") or 0,
        float(row.get("pages") or 0),
        float(row.get("api_credits") or 0),
    )
    return {
        "changes": found.changes,
        "pages_per_change": None if found.pages_per_change is None else round(found.pages_per_change, 2),
        "credits_per_change": None if found.credits_per_change is None else round(found.credits_per_change, 2),
    }


def _per_change(row: dict[str, Any]) -> str:
    """Credits per change through a scraping API, else pages per change; "-" without a change."""
    value = row.get("credits_per_change") or row.get("pages_per_change")
    return "-" if value is None else f"{value:.1f}"


def _took(row: dict[str, Any]) -> str:
    start, end = row.get("started"), row.get("finished")
    if start is None:
        return ""
    seconds = ((end or dt.datetime.now(dt.UTC)) - start).total_seconds()
    return (
        f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}m" if seconds < 7200 else f"{seconds / 3600:.1f}h"
    )


class Command(ScrapyCommand):
    requires_project = True

    def syntax(self) -> str:
        return "[options] [spider ...]"

    def short_desc(self) -> str:
        return "Show the runs of each spider: state, figures, how they finished"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--json", action="store_true", help="one JSON object per run")
        parser.add_argument("--limit", type=int, default=20, help="runs per spider (20)")
        parser.add_argument(
            "--report",
            type=int,
            metavar="RUN",
            help="print the data-quality report of run RUN and the changes it holds",
        )
        parser.add_argument(
            "--apply",
            type=int,
            metavar="RUN",
            help="write the changes run RUN held when its quality broke (see --report)",
        )
        parser.add_argument("--discard", type=int, metavar="RUN", help="drop the changes run RUN held")
        parser.add_argument(
            "--force",
            action="store_true",
            help="with --apply: write held values even where they fail the run's checks (see --report)",
        )
        parser.add_argument(
            "--revert", type=int, metavar="RUN", help="undo what finished run RUN changed, from the history"
        )

    def run(self, args: list[str], opts: Namespace) -> None:
        found = backends_or_report(self)
        if found is None:
            return
        from scrapy.spiderloader import get_spider_loader

        if opts.report is not None:
            self._report(found.database_url, args, opts.report)
            return
        actions = [
            (name, getattr(opts, name)) for name in ("apply", "discard", "revert") if getattr(opts, name) is not None
        ]
        if actions:
            if len(actions) > 1 or len(args) != 1:
                raise UsageError(
                    "--apply, --discard and --revert take one spider and one run: scrapy runs SPIDER --apply RUN"
                )
            get_spider_loader(self.settings).load(args[0])  # registers the spider's item types
            self.exitcode = changes.act(found, self.settings, args[0], *actions[0], force=opts.force)
            return
        server = get_redis(found.redis_url)
        spiders = args or sorted(get_spider_loader(self.settings).list())
        for name in spiders:
            keys.migrate_legacy(server, name)
        conn = record.connect(found.database_url)
        try:
            rows = merged_runs(
                server, conn, spiders, get_float(self.settings, "RUNS_NODE_TTL", 60.0, minimum=1), max(1, opts.limit)
            )
            outcomes = {spider: quality_store.outcomes(conn, spider) for spider in spiders}
            for row in rows:
                row["quality"] = outcomes[row["spider"]].get(row["run_id"], "")
                row.update(cost(row))
        finally:
            conn.close()
        if opts.json:
            for row in rows:
                print(json.dumps(row, default=lambda v: v.isoformat() if hasattr(v, "isoformat") else str(v)))
            return
        if not rows:
            print("no runs yet")
            return
        print(
            f"{'spider':14}"
            + "".join(f"{title:>13}" if column == "started" else f"{title:>10}" for title, column in SHOWN)
            + "  reason"
        )
        for row in rows:
            cells = []
            for _title, column in SHOWN:
                if column == "took":
                    value: Any = _took(row)
                elif column == "per_change":
                    value = _per_change(row)
                elif column == "started":
                    value = row["started"].astimezone().strftime("%m-%d %H:%M") if row.get("started") else ""
                else:
                    value = row.get(column, "")
                    value = f"{value:.0f}" if isinstance(value, float) else value
                cells.append(f"{value!s:>13}" if column == "started" else f"{value!s:>10}")
            print(f"{row['spider']:14}" + "".join(cells) + f"  {row.get('finish_reason') or ''}")
        sys.stdout.flush()

    def _report(self, database_url: str, spiders: list[str], run_id: int) -> None:
        if len(spiders) != 1:
            raise UsageError("--report needs one spider: scrapy runs SPIDER --report RUN")
        conn = quality_store.connect(database_url)
        try:
            found = quality_store.report(conn, spiders[0], run_id)
            held_lines = changes.held_report(conn, spiders[0], run_id, settings=self.settings)
        finally:
            conn.close()
        if found is None:
            print(
                f"run {run_id} of {spiders[0]} has no data-quality report: it has not finished, "
                "or it ended early (stopped, discarded), and such runs are not checked",
                file=sys.stderr,
            )
            if held_lines:
                print("\n".join(held_lines))
            self.exitcode = 1
            return
        row, checks = found
        print(quality_report.render(spiders[0], run_id, row["outcome"], row["baseline"], checks))
        if held_lines:
            print("\n".join(held_lines))
