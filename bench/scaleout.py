"""Scale-out that measures coordination, not the machine: N workers, each held to a small fixed
concurrency, against a site that takes 200 ms per page (directly, or through the scraping-API
stand-in adding the 200 ms). The rate is the site's own count of pages served per second from
the moment the last worker has joined the run until 90 % of the shop is fetched, so neither
start-up nor the tail of the crawl counts; the CPU all processes used meanwhile is reported
with it, to show whether the machine was the limit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import redis
from procs import cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
_BEGUN = re.compile(r"(starting|joining|resuming) run \d+ of demo")


def _served(url: str) -> int:
    with urllib.request.urlopen(url + "_admin/stats", timeout=10) as answer:
        return int(json.load(answer)["total"])


def scale(
    workers: int,
    env: dict[str, str],
    site: subprocess.Popen,
    site_url: str,
    pages: int,
    redis_url: str,
    others: list[int],
) -> dict[str, Any]:
    """One crawl of the shop by *workers* processes; *others*: pids whose CPU counts too."""
    server = redis.Redis.from_url(redis_url)
    server.flushdb()
    logs = [tempfile.TemporaryFile("w+") for _ in range(workers)]
    served0 = _served(site_url)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "scrapy", "crawl", "demo"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
        )
        for log in logs
    ]
    window: tuple[float, int] | None = None
    end: tuple[float, int] | None = None
    worker_cpu: dict[int, float] = {}
    while any(p.poll() is None for p in procs):
        for p in procs:
            used = cpu_seconds(p.pid)
            if used is not None:
                worker_cpu[p.pid] = used
        now, served = time.monotonic(), _served(site_url) - served0
        if window is None:
            begun = 0
            for log in logs:
                log.seek(0)
                begun += bool(_BEGUN.search(log.read()))
            if begun == workers:
                window = (now, served)
                cpu_window = {pid: cpu_seconds(pid) or 0.0 for pid in [site.pid, *others]}
                workers_window = dict(worker_cpu)
        elif end is None and served >= 0.9 * pages:
            end = (now, served)
            cpu_end = {pid: cpu_seconds(pid) or 0.0 for pid in [site.pid, *others]}
            workers_end = dict(worker_cpu)
        time.sleep(0.2)
    for p, log in zip(procs, logs):
        if p.returncode != 0:
            log.seek(0)
            sys.stderr.write(log.read()[-3000:])
            raise SystemExit("a scale-out worker failed")
    if window is None or end is None or end[0] - window[0] < 1.0:
        raise SystemExit(f"{workers} workers: the shop was crawled before every worker had joined; use a larger shop")
    seconds = end[0] - window[0]
    used = (
        sum(workers_end.values())
        - sum(workers_window.get(pid, 0.0) for pid in workers_end)
        + sum(cpu_end[pid] - cpu_window[pid] for pid in cpu_end)
    )
    return {
        "workers": workers,
        "pages_per_s": (end[1] - window[1]) / seconds,
        "window_s": seconds,
        "cpu_cores_used": used / seconds,
        "cpus": os.cpu_count(),
    }
