"""Crawls and commands as real processes, with the test session's Redis database and Postgres
database, and what every crawl test checks of the stored rows."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg2
import redis

from scraper.demo_site import Catalog, DemoSite

ROOT = Path(__file__).resolve().parents[2]  # the project: tests/support/ is two below it


def with_redis_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = dict(parse_qsl(parts.query))
        query["db"] = str(db)
        return f"unix://{parts.path}?{urlencode(query)}"
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, ""))


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


@dataclass
class Services:
    redis_url: str
    database_url: str

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url)

    def query(self, sql: str, params: tuple | None = None) -> list[tuple]:
        conn = psycopg2.connect(self.database_url)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(sql, params)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()


# The fleet secret of every crawl and queue the tests make (a shared Redis requires one).
TEST_SCHEDULER_SECRET = "test-fleet-secret-0123456789"


def crawl_env(services: Services, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL"}}
    env.update(
        REDIS_URL=services.redis_url,
        DATABASE_URL=services.database_url,
        SCHEDULER_IDLE_TIMEOUT="1",
        # The test sites listen on loopback, which crawl nodes otherwise refuse to fetch.
        FETCH_ALLOW_NETWORKS="127.0.0.0/8,::1/128",
        POSTGRES_FLUSH_INTERVAL="0.2",
        PYTHONPATH=str(ROOT),
        # Many tests change the site between runs on purpose (fewer pages, other sections), which
        # the quality checks rightly call degraded; the exit status for that (3, the default) is
        # tested where it is the subject (test_quality), with this key removed.
        QUALITY_FAIL_EXIT="0",
        SCHEDULER_SECRET=TEST_SCHEDULER_SECRET,
        # A site nobody declared starts slowly (a ramp of a few seconds, see politeness'
        # slow start): the test sites are not about that, and hundreds of crawls would each pay
        # it. The politeness tests keep the default.
        POLITENESS_SLOW_START_RATE="0",
    )
    env.update(extra)
    return env


def scrapy_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "scrapy", *args]


def run_scrapy(env: dict[str, str], *args: str, timeout: float = 180, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run a scrapy command as a real process in the project folder."""
    return subprocess.run(scrapy_cmd(*args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def assert_each_product_stored_or_rejected_once(query: Any, catalog: Catalog) -> None:
    """Every valid product is exactly one row; every broken one is in ``rejects`` (from each of
    its pages when it has no canonical URL); nothing else. *query* runs SQL on the crawl's database."""
    rows = query("SELECT sku, count(*) FROM products GROUP BY sku")
    assert all(n == 1 for _, n in rows), [r for r in rows if r[1] != 1]
    assert {sku for sku, _ in rows} == {p.sku for p in catalog.valid_products()}
    rejected = {
        int(m)
        for (url,) in query("SELECT DISTINCT url FROM rejects")
        for m in re.findall(r"/p/(\d+)\.html$", url or "")
    }
    assert rejected == {p.id for p in catalog.broken_products()}


def project_with_spider(tmp_path: Path, module: str, code: str) -> Path:
    """A copy of the project with one more spider module, run as a user's project would be."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "scraper", project / "scraper", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "scrapy.cfg", project)
    (project / "scraper" / "spiders" / f"{module}.py").write_text(code)
    return project


def crawl(services: Services, site: DemoSite, spider: str = "demo", **extra: str) -> subprocess.CompletedProcess:
    result = run_scrapy(crawl_env(services, DEMO_SITE_URL=site.url, **extra), "crawl", spider)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result


def run_scrapy_many(
    env: dict[str, str], *commands: tuple[str, ...], timeout: float = 180, cwd: Path = ROOT
) -> list[subprocess.CompletedProcess]:
    """Run independent scrapy commands as concurrent processes; results in the same order."""
    procs = [
        subprocess.Popen(scrapy_cmd(*args), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for args in commands
    ]
    results = []
    for args, proc in zip(commands, procs):
        out, err = proc.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(scrapy_cmd(*args), proc.returncode, out, err))
    return results


def assert_each_page_once(counts: dict[str, int], catalog: Catalog) -> None:
    """A recrawl's fetches (path -> count, robots.txt left out): every listing page once, and every
    product once under one of its paths. A product listed in several categories is one page, once
    its canonical link taught the fleet the aliases (scraper.identity)."""
    assert set(counts.values()) == {1}, {p: n for p, n in counts.items() if n != 1}
    listings = {p for p in catalog.pages() if "/p/" not in p}
    assert {p for p in counts if "/p/" not in p} == listings, sorted(listings ^ {p for p in counts if "/p/" not in p})
    listed = [int(re.search(r"/p/(\d+)\.html$", p).group(1)) for p in catalog.pages() if "/p/" in p]
    # A page with no canonical link (an empty body) teaches no alias: once per path it is listed at.
    expected = sorted(
        pid for pid in set(listed) for _ in range(listed.count(pid) if _no_canonical(catalog, pid) else 1)
    )
    fetched = sorted(int(re.search(r"/p/(\d+)\.html$", p).group(1)) for p in counts if "/p/" in p)
    assert fetched == expected, sorted(set(expected) ^ set(fetched)) or [p for p in fetched if fetched.count(p) > 1]


def _no_canonical(catalog: Catalog, product_id: int) -> bool:
    product = catalog.product(product_id)
    return product is not None and product.kind == "empty"


def project_with_text_cleaner(tmp_path: Path, line: str) -> Path:
    """A copy of the project whose text cleaner runs *line* (Python, on ``raw``) on every string
    first: "today's code" that extracts differently from the code that crawled."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "scraper", project / "scraper", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "scrapy.cfg", project)
    text = project / "scraper" / "cleaning" / "text.py"
    source = text.read_text()
    anchor = "    if raw is None or isinstance(raw, bool):\n        return None\n"
    assert anchor in source, "the text cleaner changed: update this helper's anchor"
    text.write_text(source.replace(anchor, f"{anchor}    if isinstance(raw, str):\n        {line}\n"))
    return project
