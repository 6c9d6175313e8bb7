"""`scrapy demo` (what `make demo` runs): the main job, end to end, twice."""

from __future__ import annotations

import re
import socket

from support.crawls import crawl_env, run_scrapy

from scraper.demo_site import Catalog


def test_demo_crawls_the_shop_then_finds_it_unchanged(clean) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = crawl_env(clean)
    env.pop("SCHEDULER_IDLE_TIMEOUT")
    catalog = Catalog(products=60)
    valid, broken = len(catalog.valid_products()), len(catalog.broken_products())

    first = run_scrapy(env, "demo", "--products", "60", "--port", str(port))
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"{valid} items stored ({valid} new, 0 updated, 0 unchanged)" in first.stdout, first.stdout
    assert (
        f"Postgres holds {valid} demo products (the shop has {valid} valid ones) and {broken} rejects" in first.stdout
    )

    second = run_scrapy(env, "demo", "--products", "60", "--port", str(port))
    assert f"{valid} items stored (0 new, 0 updated, {valid} unchanged)" in second.stdout, second.stdout
    assert f"and {broken} rejects" in second.stdout  # rejects are upserted too, not piled up

    third = run_scrapy(env, "demo", "--products", "60", "--port", str(port), "--reprice", "3")
    assert f"{valid} items stored (0 new, 3 updated, {valid - 3} unchanged)" in third.stdout, third.stdout
    assert re.search(r"in [\d.]+ s \(\d+ pages/s\)", third.stdout)

    # Through the scraping-API stand-in: the very same rows, so nothing changes.
    fourth = run_scrapy(env, "demo", "--products", "60", "--port", str(port), "--reprice", "3", "--api")
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    assert "fetched through the scraping-API stand-in" in fourth.stdout
    assert f"{valid} items stored (0 new, 0 updated, {valid} unchanged)" in fourth.stdout, fourth.stdout
    assert re.search(r"demo: [1-9]\d* microcents spent through the scraping-API stand-in", fourth.stdout)
