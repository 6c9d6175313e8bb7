"""Where the crawler's CPU per page goes: the demo spider under cProfile, plain and whole pipeline.

``.venv/bin/python bench/profile.py --products 2000`` crawls the demo shop (pages served
instantly) twice under ``cProfile``: plain Scrapy (memory scheduler, no pipelines) and the whole
pipeline. It prints, per page, the self time by package for both and their difference, then
the top functions by extra self time. Times are the reactor thread's CPU time (worker threads are
not profiled); cProfile inflates small calls, so compare shares and
before/after runs of this same script, not absolute seconds with ``bench/run.py``.

``--py-spy`` samples both crawls with py-spy instead: every thread (the Postgres writer's and
the Redis batcher's too) and no per-call overhead, but a thread blocked in a C call (a socket
read) counts as running, so read it next to the cProfile figures.

Uses REDIS_URL / DATABASE_URL as ``bench/run.py`` does (Redis db 7, database ``scraper_bench``
or ``BENCH_DATABASE``).
"""

from __future__ import annotations

import argparse
import os
import pstats
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from run import PLAIN, drop_tables, recreate_database, start_site, with_redis_db  # noqa: E402
from scrapy.settings import Settings  # noqa: E402

from scraper import backends  # noqa: E402

_PACKAGES = (
    ("scraper/queue", "scraper/queue"),
    ("scraper/pipelines", "scraper/pipelines"),
    ("scraper/cleaning", "scraper/cleaning"),
    ("scraper/storage", "scraper/storage"),
    ("scraper/monitoring", "scraper/monitoring"),
    ("scraper/politeness", "scraper/politeness"),
    ("scraper/", "scraper (other)"),
    ("site-packages/scrapy_redis", "scrapy_redis"),
    ("site-packages/scrapy/", "scrapy"),
    ("site-packages/twisted", "twisted"),
    ("asyncio", "twisted"),
    ("site-packages/redis/", "redis"),
    ("site-packages/parsel", "parsel"),
    ("site-packages/lxml", "parsel"),
    ("site-packages/w3lib", "w3lib + urllib"),
    ("urllib/", "w3lib + urllib"),
    ("site-packages/psycopg2", "psycopg2"),
    ("site-packages/prometheus_client", "prometheus_client"),
    ("json/", "json"),
    ("orjson", "json"),
)


def _package(filename: str, name: str) -> str:
    for needle, label in _PACKAGES:
        if needle in filename:
            return label
    if filename == "~":
        return "builtins: " + name.split(" of ")[0].strip("<>{}").replace("method ", "").replace("built-in ", "")[:40]
    return "other"


# The reactor thread's CPU time, not wall time: with Redis and Postgres on the same two cores,
# wall time charges their turns on the CPU to whatever Python call was running meanwhile.
_RUNNER = """
import cProfile, sys, time
from scrapy.cmdline import execute
out = sys.argv[1]
sys.argv = ["scrapy", *sys.argv[2:]]
profiler = cProfile.Profile(time.thread_time)
profiler.enable()
try:
    execute()
except SystemExit:
    pass
finally:
    profiler.disable()
    profiler.dump_stats(out)
"""


def profile(env: dict[str, str], extra: list[str], out: Path) -> tuple[pstats.Stats, float]:
    log = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(out), "crawl", "demo", "-s", "LOG_LEVEL=INFO", *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if log.returncode != 0:
        sys.stderr.write(log.stderr[-3000:])
        raise SystemExit("crawl failed")
    pages = float(re.search(r"'response_received_count': (\d+)", log.stderr).group(1))
    return pstats.Stats(str(out)), pages


# Frames where a thread waits rather than runs: py-spy counts a thread blocked in C as active.
_IDLE = re.compile(r"(Condition\.wait|Selector\.select|_wait_for_tstate_lock|sleep) \([^;]*$")


def spy(
    env: dict[str, str], extra: list[str], out: Path, rate: int = 400
) -> tuple[dict[str, int], dict[str, int], int]:
    """The crawl under py-spy (a sampling profiler: no per-call overhead, every thread): samples
    per function, inclusive and self, leaving out stacks that end waiting."""
    binary = Path(sys.executable).with_name("py-spy")
    subprocess.run(
        [
            str(binary),
            "record",
            "-r",
            str(rate),
            "-f",
            "raw",
            "-o",
            str(out),
            "--",
            sys.executable,
            "-m",
            "scrapy",
            "crawl",
            "demo",
            "-s",
            "LOG_LEVEL=WARNING",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    inclusive: dict[str, int] = defaultdict(int)
    own: dict[str, int] = defaultdict(int)
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or _IDLE.search(stack):
            continue
        n = int(count)
        total += n
        frames = [
            re.sub(r":\d+\)$", ")", f).replace(str(ROOT) + "/", "").split("site-packages/")[-1]
            for f in stack.split(";")
        ]
        for frame in set(frames):
            inclusive[frame] += n
        own[frames[-1]] += n
    return inclusive, own, total


def by_function(stats: pstats.Stats, pages: float) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for (filename, line, name), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
        short = filename.split("site-packages/")[-1].split("wt-issue15/")[-1]
        out[f"{short}:{line}({name})"] += 1e6 * tt / pages
    return out


def by_package(stats: pstats.Stats, pages: float) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for (filename, _line, name), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
        out[_package(filename, name)] += 1e6 * tt / pages
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--products", type=int, default=2000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--only", choices=["plain", "pipeline"], default=None)
    parser.add_argument(
        "--py-spy",
        action="store_true",
        help="sample with py-spy instead (every thread, no per-call overhead; samples, not µs)",
    )
    args = parser.parse_args()

    found = backends.resolve(
        Settings(
            {
                "REDIS_URL": os.environ.get("REDIS_URL", ""),
                "DATABASE_URL": os.environ.get("DATABASE_URL", ""),
                "DATA_DIR": tempfile.mkdtemp(prefix="scraper-profile-"),
            }
        )
    )
    redis_url = with_redis_db(found.redis_url, 7)
    dsn = recreate_database(found.database_url)
    site, url = start_site(args.products)
    workdir = Path(tempfile.mkdtemp(prefix="scraper-profile-"))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DEMO_SITE_URL": url,
        "FETCH_ALLOW_NETWORKS": "127.0.0.0/8",
        "REDIS_URL": redis_url,
        "DATABASE_URL": dsn,
        "SCHEDULER_IDLE_TIMEOUT": "0",
    }
    results = {}
    try:
        for name, extra in (("plain", PLAIN), ("pipeline", [])):
            if args.only and args.only != name:
                continue
            redis.Redis.from_url(redis_url).flushdb()
            drop_tables(dsn)
            if args.py_spy:
                results[name] = spy(env, extra, workdir / f"{name}.txt")
                print(f"{name}: {results[name][2]} samples, in {workdir / (name + '.txt')}", flush=True)
                continue
            stats, pages = profile(env, extra, workdir / f"{name}.prof")
            results[name] = (stats, pages)
            print(f"{name}: {pages:.0f} pages, profile in {workdir / (name + '.prof')}", flush=True)
    finally:
        site.terminate()
        site.wait()

    if args.py_spy:
        print_samples(results, args.top)
        return
    packages = {name: by_package(s, p) for name, (s, p) in results.items()}
    plain = packages.get("plain", {})
    pipe = packages.get("pipeline", {})
    print(
        f"\nself time per page by package (µs; cProfile-inflated)\n{'package':34}{'plain':>9}{'pipeline':>10}{'extra':>9}"
    )
    for label in sorted(set(plain) | set(pipe), key=lambda k: -(pipe.get(k, 0) - plain.get(k, 0)))[: args.top]:
        print(
            f"{label:34}{plain.get(label, 0):>9.0f}{pipe.get(label, 0):>10.0f}{pipe.get(label, 0) - plain.get(label, 0):>+9.0f}"
        )
    print(
        f"{'total':34}{sum(plain.values()):>9.0f}{sum(pipe.values()):>10.0f}"
        f"{sum(pipe.values()) - sum(plain.values()):>+9.0f}"
    )

    funcs = {name: by_function(s, p) for name, (s, p) in results.items()}
    fp, fq = funcs.get("plain", {}), funcs.get("pipeline", {})
    print(f"\ntop functions by extra self time per page (µs)\n{'function':90}{'plain':>8}{'pipeline':>9}{'extra':>8}")
    for label in sorted(set(fp) | set(fq), key=lambda k: -(fq.get(k, 0) - fp.get(k, 0)))[: args.top]:
        print(
            f"{label[-90:]:90}{fp.get(label, 0):>8.1f}{fq.get(label, 0):>9.1f}{fq.get(label, 0) - fp.get(label, 0):>+8.1f}"
        )


def print_samples(results: dict[str, tuple[dict[str, int], dict[str, int], int]], top: int) -> None:
    """Samples per function (both crawls crawl the same pages, so counts compare directly)."""
    empty: tuple[dict[str, int], dict[str, int], int] = ({}, {}, 0)
    plain, pipe = results.get("plain", empty), results.get("pipeline", empty)
    print(f"\nsamples: plain {plain[2]}, pipeline {pipe[2]}")
    for title, index, only in (("self samples", 1, ""), ("inclusive samples, scraper/", 0, "scraper/")):
        a, b = plain[index], pipe[index]
        print(f"\n{title}, by extra\n{'function':100}{'plain':>8}{'pipeline':>9}{'extra':>8}")
        keys = [k for k in set(a) | set(b) if only in k]
        for k in sorted(keys, key=lambda k: -(b.get(k, 0) - a.get(k, 0)))[:top]:
            print(f"{k[-100:]:100}{a.get(k, 0):>8}{b.get(k, 0):>9}{b.get(k, 0) - a.get(k, 0):>+8}")


if __name__ == "__main__":
    main()
