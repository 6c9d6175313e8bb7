"""``scrapy queue [spider...]``: the shared queues at a glance.

For each spider with state in Redis: queue depth, age of the oldest queued request, live nodes
and their in-flight requests, seen-set size (estimated for a Bloom filter), and pages/items per
minute across the fleet (sampled over ``--interval`` seconds from what each node reports with
its heartbeat); with ``PROCESSING=decoupled``, the responses in the stream not processed yet.
Below them, the fleet's adaptive rate of each site that throttled it (429/503), and since when.
``--watch`` repeats until interrupted.
"""

from __future__ import annotations

import json
import sys
import time
from argparse import ArgumentParser, Namespace
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.spiderloader import get_spider_loader

from ..backends.redis_client import get_redis
from ..config import ConfigError
from ..politeness.adaptive import ADAPTIVE_KEY, parse_rates
from ..queue import keys
from ..queue.dupefilter import seen_config, seen_size
from ..queue.queues import frontier
from . import SpiderName, backends_or_report, spider_or_report

NODE_TTL = 60.0


def snapshot(server: Any, name: str, now: float | None = None, settings: Any = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    queue = frontier(server, SpiderName(name), settings)
    beats = {k.decode(): float(v) for k, v in server.hgetall(keys.nodes_key(name)).items()}
    live = {node for node, beat in beats.items() if beat >= now - NODE_TTL}
    infos = [json.loads(v) for k, v in server.hgetall(f"{keys.nodes_key(name)}:info").items() if k.decode() in live]
    return {
        "spider": name,
        "depth": len(queue),
        "oldest_age": queue.oldest_age(now),
        "nodes": len(live),
        "inflight": sum(int(i.get("inflight", 0)) for i in infos),
        "seen": round(seen_size(server, name, settings if settings is not None else {})),
        "pages": sum(int(i.get("pages", 0)) for i in infos),
        "items": sum(int(i.get("items", 0)) for i in infos),
        "dead": server.llen(keys.dead_key(name)),
        # PROCESSING=decoupled: fetched, not yet processed (waiting, or in a processor's hands).
        "responses": server.xlen(keys.responses_key(name)),
    }


def adaptive_rates(server: Any) -> dict[str, tuple[float, float]]:
    """Domain -> (the fleet's current rate, seconds since the site last throttled it)."""
    now_s, now_us = server.time()
    flat = [part for pair in server.hgetall(ADAPTIVE_KEY).items() for part in pair]
    return parse_rates([now_s * 1_000_000 + now_us, flat])


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False  # no crawl: no Scrapy banner either

    def syntax(self) -> str:
        return "[options] [spider ...]"

    def short_desc(self) -> str:
        return "Show the shared queues: depth, oldest request, nodes, in-flight, seen-set, rates"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--interval", type=float, default=3.0, help="seconds to sample rates over (3)")
        parser.add_argument("--watch", action="store_true", help="repeat until interrupted")
        parser.add_argument("--json", action="store_true", help="one JSON object per spider")

    def run(self, args: list[str], opts: Namespace) -> None:
        if any(spider_or_report(self, name) is None for name in args):
            return
        found = backends_or_report(self, need_postgres=False, signs=True)
        if found is None:
            return
        try:
            seen_config(self.settings)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 2
            return
        server = get_redis(found.redis_url)
        names = args or sorted(get_spider_loader(self.settings).list())
        for name in names:
            keys.migrate_legacy(server, name)
        try:
            while True:
                before = {n: snapshot(server, n, settings=self.settings) for n in names}
                time.sleep(max(0.1, opts.interval))
                after = {n: snapshot(server, n, settings=self.settings) for n in names}
                self._print(before, after, opts, adaptive_rates(server))
                if not opts.watch:
                    return
        except KeyboardInterrupt:
            return

    def _print(self, before: dict, after: dict, opts: Namespace, rates: dict[str, tuple[float, float]]) -> None:
        minutes = max(0.1, opts.interval) / 60
        rows = []
        for name, now in after.items():
            row = dict(now)
            row["pages_per_min"] = max(0, now["pages"] - before[name]["pages"]) / minutes
            row["items_per_min"] = max(0, now["items"] - before[name]["items"]) / minutes
            rows.append(row)
        if opts.json:
            shared = {d: {"rate": r, "since_throttled": round(t, 1)} for d, (r, t) in sorted(rates.items())}
            for row in rows:
                print(json.dumps({**row, "adaptive_rates": shared}))
            return
        print(
            f"{'spider':16}{'queued':>9}{'oldest':>8}{'nodes':>7}{'in-flight':>10}{'seen':>10}"
            f"{'pages/min':>11}{'items/min':>11}"
        )
        for r in rows:
            print(
                f"{r['spider']:16}{r['depth']:>9}{_age(r['oldest_age']):>8}{r['nodes']:>7}{r['inflight']:>10}"
                f"{r['seen']:>10}{r['pages_per_min']:>11.0f}{r['items_per_min']:>11.0f}"
                + (f"   ({r['responses']} responses wait for `scrapy process {r['spider']}`)" if r["responses"] else "")
                + (f"   ({r['dead']} dead letters: scrapy dlq list {r['spider']})" if r["dead"] else "")
            )
        self._print_rates(rates)

    def _print_rates(self, rates: dict[str, tuple[float, float]]) -> None:
        if rates:
            print("adaptive rates (sites that throttled the fleet):")
            for domain, (rate, since) in sorted(rates.items(), key=lambda kv: kv[1][0])[:20]:
                print(f"  {domain:30}{rate:>9.2f} requests/s   last 429/503 {_age(since)} ago")
            if len(rates) > 20:
                print(f"  ... and {len(rates) - 20} more")
        sys.stdout.flush()
