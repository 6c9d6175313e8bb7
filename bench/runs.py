"""Runs: what the run bookkeeping costs, and how fast a dead worker's requests come back.

`.venv/bin/python bench/runs.py` prints:

1. the start-up cost of run bookkeeping, in ms (median and p95 of ``--repeat`` runs): deciding
   the run in Redis (one script: prune dead nodes, start/resume/join), the Postgres row written
   at start (connect, check the table, upsert), and leaving the run (one script);
2. redelivery after a SIGKILL (as in ``bench/run.py`` 2b): a worker holding leases is killed, a
   fresh worker starts at once; seconds until the first of its requests is back in the queue and
   until all of them were fetched again. The bound is the lease timeout plus one reaping tick.

Uses REDIS_URL / DATABASE_URL when set, the embedded servers otherwise; writes only to Redis
database 7 and the Postgres database ``scraper_bench``, which it recreates.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import redis  # noqa: E402
from run import recreate_database, redelivery, with_redis_db  # noqa: E402
from scrapy.settings import Settings  # noqa: E402

from scraper import backends  # noqa: E402
from scraper.queue import keys  # noqa: E402
from scraper.runs import record  # noqa: E402
from scraper.runs.nodes import NodeRegistry  # noqa: E402
from scraper.runs.state import RunState  # noqa: E402

# The bench site listens on loopback, which crawl nodes refuse to fetch unless allowed.
os.environ.setdefault("FETCH_ALLOW_NETWORKS", "127.0.0.0/8")
# Its crawls share a Redis, which requires a fleet secret to sign queue entries with.
os.environ.setdefault("SCHEDULER_SECRET", "bench-fleet-secret-0123456789")


def bookkeeping(redis_url: str, dsn: str, repeat: int) -> dict[str, list[float]]:
    server = redis.Redis.from_url(redis_url)
    server.flushdb()
    timings: dict[str, list[float]] = {"decide": [], "record": [], "leave": []}
    run_keys = keys.crawl_scoped_keys("bench")
    for _ in range(repeat):
        nodes = NodeRegistry(server, keys.nodes_key("bench"), ttl=60)
        state = RunState(server, "bench", nodes, keys.queue_key("bench"))
        started = time.perf_counter()
        decision = state.begin(run_keys)
        timings["decide"].append(time.perf_counter() - started)
        started = time.perf_counter()
        conn = record.connect(dsn)
        record.upsert(conn, "bench", decision.run_id, state.current(), {}, 1)
        conn.close()
        timings["record"].append(time.perf_counter() - started)
        nodes.beat(force=True)
        started = time.perf_counter()
        outcome, _live = state.leave("finished", run_keys)
        timings["leave"].append(time.perf_counter() - started)
        assert outcome == "finished", outcome
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--products", type=int, default=400)
    args = parser.parse_args()
    found = backends.resolve(
        Settings(
            {
                "REDIS_URL": os.environ.get("REDIS_URL", ""),
                "DATABASE_URL": os.environ.get("DATABASE_URL", ""),
                "DATA_DIR": tempfile.mkdtemp(prefix="scraper-bench-"),
            }
        )
    )
    redis_url = with_redis_db(found.redis_url, 7)
    dsn = recreate_database(found.database_url)

    timings = bookkeeping(redis_url, dsn, args.repeat)
    print(f"run bookkeeping at start and end, {args.repeat} runs (ms: median / p95):")
    for name, values in timings.items():
        ms = sorted(v * 1000 for v in values)
        print(f"  {name:7} {statistics.median(ms):7.2f} / {ms[int(len(ms) * 0.95) - 1]:7.2f}")
    total = [sum(t) * 1000 for t in zip(*timings.values())]
    print(f"  total   {statistics.median(total):7.2f} / {sorted(total)[int(len(total) * 0.95) - 1]:7.2f}")

    result = redelivery(redis_url, dsn, args.lease, args.products)
    print(
        f"\nredelivery after SIGKILL (lease {args.lease:g} s, {result['held']:.0f} requests held): first back in "
        f"the queue after {result['requeued_s']:.1f} s, all fetched again after {result['refetched_s']:.1f} s"
    )


if __name__ == "__main__":
    main()
