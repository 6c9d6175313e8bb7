"""``scrapy reprocess`` against the live crawl it replays: pages/s and CPU per page of each.

The demo shop is crawled with the archive on, pages served instantly (the crawl is then CPU-bound
in the same parsing and item pipeline a replay runs) and at 100 ms per page (a real site's
latency, at the default concurrency); the archive of the instant crawl is then replayed, by each
way of replaying in turn, in one run:

* ``engine``: ``scrapy reprocess --engine``, through Scrapy's scheduler and downloader in one
  process (how every replay ran before the direct path);
* ``before``: ``scrapy reprocess`` of another checkout (``--before PATH``, e.g. the commit before
  the change), on the same archive and database;
* ``direct``: the direct path in one process (``--workers 1``);
* ``default``: ``scrapy reprocess`` as it runs by default (the direct path, one worker process per
  CPU once there are 1,000 pages per worker).

Pages/s of a crawl is its own summary figure (pages over the time from its start to its last
response). Pages/s of a replay is stricter: pages over the time from the first spider's opening
to the last one's close, every page's items stored (the last progress line). Neither counts the
process's start (imports, the record selection), which the wall time and the CPU figures do:
CPU is that of the command's processes (workers included) and of the Postgres backends its
writers opened. ``--repeat`` runs the whole set again (each time on a fresh database, the
replays in another order); the ratios are medians of the per-run ones.

``.venv/bin/python bench/reprocess.py --products 2000 --repeat 3`` uses REDIS_URL as it is (a
database of its own, e.g. ``redis://127.0.0.1:6379/4``, flushed) and DATABASE_URL's server, in
the database ``BENCH_DATABASE`` (default ``scraper_bench``), dropped and made again.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_SUMMARY = re.compile(r"Crawl summary \([^)]*\): (\d+) pages.*\((\d+) pages/s\)")
_FINAL = re.compile(r"^reprocess: (\d+) pages, .*\((\d+) pages/s\)$", re.M)
_PROGRESS = re.compile(r"reprocess: (\d+)/(\d+) pages, (\d+) pages/s")


def run(env: dict[str, str], *args: str, cwd: Path = ROOT, dsn: str = "") -> dict[str, float]:
    """One scrapy command: its pages, pages/s, wall seconds and CPU seconds (its processes, and
    the Postgres backends they opened when *dsn* is given)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scrapy", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    watch = _BackendWatch(dsn, proc.pid) if dsn else None
    out, err = proc.communicate()
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    backends = watch.stop() if watch else 0.0
    stderr = err.decode(errors="replace")
    if proc.returncode != 0:
        sys.stderr.write(stderr[-4000:])
        raise SystemExit(f"scrapy {' '.join(args)} failed")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    workers = re.search(r"replayed with no network in (\d+) processes", stderr)
    result = {"wall_s": wall, "cpu_s": cpu, "postgres_cpu_s": backends, "processes": int(workers[1]) if workers else 1}
    if args[0] == "reprocess" and "no archived pages" in stderr:
        return result  # the cost of starting and picking the records, alone
    progress = _PROGRESS.findall(stderr)
    final = _FINAL.findall(stderr)
    summary = _SUMMARY.findall(stderr)
    if args[0] == "reprocess" and progress and final:
        result["pages"] = float(progress[-1][0])
        result["pages_per_s"] = float(progress[-1][2])
        result["summary_pages_per_s"] = float(final[-1][1])
    elif summary:
        result["pages"], result["pages_per_s"] = float(summary[-1][0]), float(summary[-1][1])
        result["summary_pages_per_s"] = result["pages_per_s"]
    else:
        sys.stderr.write(stderr[-4000:])
        raise SystemExit(f"scrapy {' '.join(args)}: no summary line")
    return result


class _BackendWatch:
    """CPU of the Postgres backends the command's processes (workers included) open, sampled
    while it runs: a backend is gone once its process closes the connection."""

    def __init__(self, dsn: str, pid: int) -> None:
        from procs import PostgresWatch

        self.watch = PostgresWatch(dsn)
        self.pid = pid
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.done.wait(0.1):
            try:
                self.watch.poll(_tree(self.pid))
            except Exception:
                pass

    def stop(self) -> float:
        self.done.set()
        self.thread.join()
        used = self.watch.backends_cpu()
        self.watch.close()
        return used


def _tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return found


def measure(env: dict[str, str], site_url: str, slow_site_url: str, fresh: callable) -> dict[str, float]:
    """The live crawls and the default replay, as ``bench/run.py --only reprocess`` reports them."""
    archive = tempfile.mkdtemp(prefix="bench-reprocess-")
    env = {**env, "ARCHIVE_URL": archive}
    fresh()
    slow = run({**env, "DEMO_SITE_URL": slow_site_url, "ARCHIVE_URL": archive + "-slow"}, "crawl", "demo")
    fresh()
    live = run({**env, "DEMO_SITE_URL": site_url}, "crawl", "demo")
    replay = run(env, "reprocess", "demo")
    return {
        "pages": live["pages"],
        "replayed": replay["pages"],
        "live_pages_per_s": live["pages_per_s"],
        "live_100ms_pages_per_s": slow["pages_per_s"],
        "reprocess_pages_per_s": replay["pages_per_s"],
        "reprocess_cpu_ms_per_page": 1000 * replay["cpu_s"] / replay["pages"],
        "live_cpu_ms_per_page": 1000 * live["cpu_s"] / live["pages"],
    }


def main() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT))
    import redis
    from run import recreate_database, start_site
    from scrapy.settings import Settings

    from scraper import backends

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--products", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", type=Path, help="a checkout of the code before, replayed as 'before'")
    parser.add_argument("--variants", nargs="+", default=["engine", "before", "direct", "default"])
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    variants = [v for v in args.variants if v != "before" or args.before]

    found = backends.resolve(
        Settings({"REDIS_URL": os.environ.get("REDIS_URL", ""), "DATABASE_URL": os.environ.get("DATABASE_URL", "")})
    )
    server = redis.Redis.from_url(found.redis_url)
    dsn = recreate_database(found.database_url)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "REDIS_URL": found.redis_url,
        "DATABASE_URL": dsn,
        "SCHEDULER_IDLE_TIMEOUT": "0",
        "METRICS_ENABLED": "false",
        "FETCH_ALLOW_NETWORKS": "127.0.0.0/8",
        "SCHEDULER_SECRET": os.environ.get("SCHEDULER_SECRET") or "bench-fleet-secret-0123456789",
    }
    site, url = start_site(args.products, 0)
    slow, slow_url = start_site(args.products, 100)
    runs: list[dict[str, Any]] = []
    print(f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    try:
        for n in range(args.repeat):
            runs.append(_one_run(n, variants, env, url, slow_url, dsn, server, args.before))
    finally:
        for proc in (site, slow):
            proc.terminate()
            proc.wait()
    _report(runs, variants)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


def _fresh(server: Any, dsn: str) -> None:
    import psycopg2

    server.flushdb()
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    conn.close()


def _one_run(
    n: int,
    variants: list[str],
    env: dict[str, str],
    url: str,
    slow_url: str,
    dsn: str,
    server: Any,
    before: Path | None,
) -> dict[str, Any]:
    archive = tempfile.mkdtemp(prefix="bench-reprocess-")
    env = {**env, "ARCHIVE_URL": archive}
    figures: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    _fresh(server, dsn)
    figures["live 100 ms"] = run(
        {**env, "DEMO_SITE_URL": slow_url, "ARCHIVE_URL": archive + "-slow"}, "crawl", "demo", dsn=dsn
    )
    _fresh(server, dsn)
    figures["live instant"] = run({**env, "DEMO_SITE_URL": url}, "crawl", "demo", dsn=dsn)
    order = variants[n % len(variants) :] + variants[: n % len(variants)]
    for name in order:
        figures["load " + name] = os.getloadavg()[0]
        if name == "before":
            assert before is not None
            figures[name] = run({**env, "PYTHONPATH": str(before)}, "reprocess", "demo", cwd=before, dsn=dsn)
        else:
            extra = {"engine": ["--engine"], "direct": ["--workers", "1"], "default": []}[name]
            figures[name] = run(env, "reprocess", "demo", *extra, dsn=dsn)
    # What a replay costs besides its pages: a process replaying one page (a worker's start and
    # end), and one that only picks the records (the command of a replay in several processes).
    figures["start"] = run(env, "reprocess", "demo", "--url", "*/p/1.html", "--workers", "1")
    figures["select"] = run(env, "reprocess", "demo", "--url", "no page")
    figures["load"] = os.getloadavg()
    line = ", ".join(f"{k} {figures[k]['pages_per_s']:.0f}" for k in ("live instant", "live 100 ms", *order))
    print(f"run {n + 1}: pages/s: {line}; load {figures['load'][0]:.2f}", flush=True)
    return figures


def _report(runs: list[dict[str, Any]], variants: list[str]) -> None:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    start_cpu = med([r["start"]["cpu_s"] for r in runs])
    select_cpu = med([r["select"]["cpu_s"] for r in runs])
    print(
        f"\nmedians of {len(runs)} runs; CPU of a replay process's start and end (one page): {start_cpu:.2f} s, "
        f"of picking the records alone: {select_cpu:.2f} s"
    )
    print(
        f"{'':14}{'pages/s':>9}{'(summary)':>10}{'wall s':>8}{'procs':>6}{'CPU s':>7}{'CPU ms/page':>12}"
        f"{'+ Postgres':>11}{'replaying':>10}{'x instant':>10}{'x 100 ms':>9}"
    )
    for name in ("live instant", "live 100 ms", *variants):
        rows = [r[name] for r in runs]
        pages = med([x["pages"] for x in rows])
        cpu = med([x["cpu_s"] for x in rows])
        procs = max(x["processes"] for x in rows)
        line = (
            f"{name:14}{med([x['pages_per_s'] for x in rows]):>9.0f}{med([x['summary_pages_per_s'] for x in rows]):>10.0f}"
            f"{med([x['wall_s'] for x in rows]):>8.1f}{procs:>6}{cpu:>7.2f}{1000 * cpu / pages:>12.2f}"
            f"{1000 * med([x['cpu_s'] + x['postgres_cpu_s'] for x in rows]) / pages:>11.2f}"
        )
        if name.startswith("live"):
            print(line)
            continue
        # The CPU of the pages alone, less each process's start (an estimate: see above).
        besides = start_cpu if procs == 1 else select_cpu + procs * start_cpu
        ratios = [
            med([r[name]["pages_per_s"] / r[live]["pages_per_s"] for r in runs])
            for live in ("live instant", "live 100 ms")
        ]
        print(line + f"{1000 * (cpu - besides) / pages:>10.2f}{ratios[0]:>9.1f}x{ratios[1]:>8.1f}x")
    loads = [x for r in runs for x in (r["load"][0], *(v for k, v in r.items() if k.startswith("load ")))]
    print(f"load average (1 min) during the runs: {min(loads):.2f}-{max(loads):.2f}")


if __name__ == "__main__":
    main()
