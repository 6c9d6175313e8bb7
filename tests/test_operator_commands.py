"""Operator commands: seed, queue, dlq and migrate on a real crawl's Redis and Postgres."""

from __future__ import annotations

import json
import socket

from support.crawls import crawl_env, run_scrapy, run_scrapy_many
from support.queue import queue_entries

from scraper.demo_site import Catalog, DemoSite
from scraper.queue import signing

BANNER = "Scrapy 2.19.0 started"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_line_error(result, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: ") and all(w in result.stderr for w in words), result.stderr


def test_unknown_spider_is_one_line_and_migrate_starts_no_redis(clean, tmp_path) -> None:
    data_dir = tmp_path / "data"
    env = crawl_env(clean, DATA_DIR=str(data_dir))
    unknown = run_scrapy_many(env, ("seed", "nope", "http://shop.test/"), ("queue", "nope"), ("dlq", "list", "nope"))
    for result in unknown:
        one_line_error(result, "Spider not found: nope")
    migrate = run_scrapy({**env, "REDIS_URL": ""}, "migrate")
    assert migrate.returncode == 0, migrate.stderr
    assert "created table products" in migrate.stdout and BANNER not in migrate.stderr
    assert not (data_dir / "redis").exists()


def test_seeds_are_seen_and_dead_letters_are_one_per_request(clean) -> None:
    catalog = Catalog(products=6)
    unreachable = f"http://127.0.0.1:{closed_port()}/gone"
    with DemoSite(catalog) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url)
        product = f"{site.url.rstrip('/')}{catalog.product(1).paths[0]}"
        seeded = run_scrapy(env, "seed", "demo", site.url, product, unreachable)
        again = run_scrapy(env, "seed", "demo", product)
        crawl_args = ("crawl", "demo", "-s", "RETRY_TIMES=1", "-s", "ROBOTSTXT_OBEY=False")
        first = run_scrapy(env, *crawl_args)
        hits = site.stats()["requests"]
        requeued = run_scrapy(env, "dlq", "requeue", "demo", "--all")
        back = [json.loads(signing.unwrap(m)) for m in queue_entries(clean.redis(), "{demo}:requests")]
        second = run_scrapy(env, *crawl_args)
    relisted = run_scrapy(env, "dlq", "list", "demo")
    shown = run_scrapy(env, "dlq", "show", "demo", "0")
    purged = run_scrapy(env, "dlq", "purge", "demo", "--reason", "download")

    for result in (seeded, again, first, requeued, second, relisted, shown, purged):
        assert result.returncode == 0, result.stderr[-3000:]
    for result in (seeded, again, requeued, relisted, shown, purged):
        assert BANNER not in result.stderr and not result.stderr, result.stderr
    assert "queued 3 start URL(s) for 'demo'" in seeded.stdout
    assert (
        "queued 0 start URL(s)" in again.stdout
        and "1 URL(s) already seen in this run, not queued again" in again.stdout
    )
    # Seeded pages are in the seen-set: the home page (also the start URL) and a product the
    # crawl links to were each fetched once.
    assert hits["/"] == 1 and hits[catalog.product(1).paths[0]] == 1, hits

    assert [r["url"] for r in back] == [unreachable] and "retry_times" not in back[0]["meta"]
    assert "requeued 1 dead letter(s) for 'demo'; 0 left" in requeued.stdout
    # The requeued request got its full retries again, and its new dead letter replaced the old.
    assert "'retry/count': 1," in first.stderr and "'retry/count': 1," in second.stderr, second.stderr[-3000:]
    lines = [line for line in relisted.stdout.splitlines() if "attempts=" in line]
    assert len(lines) == 1 and "attempts=2  count=2" in lines[0] and unreachable in lines[0], relisted.stdout
    assert f"request:   GET {unreachable}" in shown.stdout and "dead-lettered 2 time(s)" in shown.stdout
    assert "callback:  parse" in shown.stdout and "header:    User-Agent: scraper" in shown.stdout
    assert "purged 1 dead letter(s) for 'demo'; 0 left" in purged.stdout
    assert clean.redis().llen("{demo}:dead") == 0 and clean.redis().hlen("{demo}:dead:index") == 0
