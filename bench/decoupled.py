"""Decoupled processing (``PROCESSING=decoupled``) against in-process, at equal CPU.

The demo shop, pages served instantly (so the CPU is the limit), crawled through the whole
pipeline by: one in-process crawler; one fetcher and one processor; two in-process crawlers (the
same number of processes as the decoupled pair). Pages/s is the pages fetched over the time from
launch until the crawl is done (the last in-process crawler, or the fetcher, which stays until
the stream is empty, has exited); the CPU is that of every crawl process (from their rusage), of
the bench's own Redis server and of the Postgres backends they used (from /proc).
"""

from __future__ import annotations

import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from procs import PostgresWatch, cpu_seconds, redis_pid

ROOT = Path(__file__).resolve().parent.parent


def run(
    env: dict[str, str], commands: list[tuple[str, ...]], dsn: str, server: Any, done_when: list[int]
) -> dict[str, float]:
    """Launch *commands* together; the crawl is done when the processes at *done_when* (indices)
    have exited. Returns pages, pages/s and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    redis_cpu0 = cpu_seconds(redis_pid(server)) or 0.0
    watch = PostgresWatch(dsn)
    logs = [tempfile.TemporaryFile("w+") for _ in commands]
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "scrapy", *args, "-s", "LOG_LEVEL=INFO"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
        )
        for args, log in zip(commands, logs)
    ]
    done_at = None
    while any(p.poll() is None for p in procs):
        watch.poll([p.pid for p in procs])
        if done_at is None and all(procs[i].poll() is not None for i in done_when):
            done_at = time.monotonic()
        time.sleep(0.1)
    done_at = done_at or time.monotonic()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    redis_cpu = (cpu_seconds(redis_pid(server)) or redis_cpu0) - redis_cpu0
    pg_cpu = watch.backends_cpu() + watch.background_cpu()
    watch.close()
    texts = []
    for proc, log in zip(procs, logs):
        log.seek(0)
        texts.append(log.read())
        if proc.returncode != 0:
            sys.stderr.write(texts[-1][-4000:])
            raise SystemExit("a crawl process failed")
    pages = sum(
        float(m.group(1))
        for text, args in zip(texts, commands)
        if args[0] == "crawl"
        for m in [re.search(r"'response_received_count': (\d+)", text)]
        if m
    )
    items = sum(float(m.group(1)) for text in texts for m in [re.search(r"'item_scraped_count': (\d+)", text)] if m)
    crawl_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    wall = done_at - started
    return {
        "pages": pages,
        "items": items,
        "seconds": wall,
        "pages_per_s": pages / wall,
        "crawl_cpu_s": crawl_cpu,
        "redis_cpu_s": redis_cpu,
        "postgres_cpu_s": pg_cpu,
        "all_cpu_s": crawl_cpu + redis_cpu + pg_cpu,
    }


VARIANTS: list[tuple[str, list[tuple[str, ...]], dict[str, str], list[int]]] = [
    ("in-process, 1 crawler", [("crawl", "demo")], {}, [0]),
    # The processor may start before the fetcher has joined the run: it must not take the empty
    # stream for the end (the bench's SCHEDULER_IDLE_TIMEOUT is 0).
    (
        "decoupled, 1 fetcher + 1 processor",
        [("crawl", "demo"), ("process", "demo", "-s", "SCHEDULER_IDLE_TIMEOUT=5")],
        {"PROCESSING": "decoupled"},
        [0],
    ),
    ("in-process, 2 crawlers", [("crawl", "demo"), ("crawl", "demo")], {}, [0, 1]),
]
