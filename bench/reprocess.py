"""``scrapy reprocess`` against the live crawl it replays: pages/s of each.

The demo shop is crawled with the archive on, pages served instantly (the crawl is then CPU-bound
in the same parsing and item pipeline a replay runs) and at 100 ms per page (a real site's
latency, at the default concurrency); the archive of the instant crawl is then replayed. Pages/s
is each process's own figure (pages over the time from its first to its last response).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_SUMMARY = re.compile(r"Crawl summary \([^)]*\): (\d+) pages.*\((\d+) pages/s\)")


def run(env: dict[str, str], *args: str) -> tuple[int, float]:
    """(pages, pages/s) of one scrapy command."""
    out = subprocess.run([sys.executable, "-m", "scrapy", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"scrapy {' '.join(args)} failed")
    found = _SUMMARY.findall(out.stderr)
    if not found:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"scrapy {' '.join(args)}: no summary line")
    pages, rate = found[-1]
    return int(pages), float(rate)


def measure(env: dict[str, str], site_url: str, slow_site_url: str, fresh: callable) -> dict[str, float]:
    archive = tempfile.mkdtemp(prefix="bench-reprocess-")
    env = {**env, "ARCHIVE_URL": archive}
    fresh()
    slow_pages, slow_rate = run(
        {**env, "DEMO_SITE_URL": slow_site_url, "ARCHIVE_URL": archive + "-slow"}, "crawl", "demo"
    )
    fresh()
    pages, live_rate = run({**env, "DEMO_SITE_URL": site_url}, "crawl", "demo")
    replayed, replay_rate = run(env, "reprocess", "demo")
    return {
        "pages": pages,
        "replayed": replayed,
        "live_pages_per_s": live_rate,
        "live_100ms_pages_per_s": slow_rate,
        "reprocess_pages_per_s": replay_rate,
    }
