"""Redis up but refusing writes (maxmemory under noeviction, a read-only replica, a failed snapshot)
is an outage the crawl waits out, like an unreachable Redis: the refusals are classed with it."""

from __future__ import annotations

import re
import time

import pytest
from support.crawls import assert_each_product_stored_or_rejected_once, crawl_env
from support.processes import start_crawl, wait_for

from scraper.backends.redis_client import UNREACHABLE, register_script, unreachable_reason
from scraper.demo_site import Catalog, DemoSite


def test_oom_inside_a_script_is_waited_out_and_named(own_redis) -> None:
    claim = register_script(own_redis, "return redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])")
    own_redis.config_set("maxmemory-policy", "noeviction")
    own_redis.config_set("maxmemory", "1")
    with pytest.raises(UNREACHABLE) as caught:
        claim(keys=["dedupe"], args=["sku", "origin"])
    assert "noeviction" in unreachable_reason(caught.value)
    own_redis.config_set("maxmemory", "0")
    assert claim(keys=["dedupe"], args=["sku", "origin"]) == 1


def test_readonly_replica_is_waited_out(own_redis) -> None:
    # A replica of a master that is not there answers writes with READONLY.
    own_redis.execute_command("REPLICAOF", "127.0.0.1", "1")
    with pytest.raises(UNREACHABLE) as caught:
        own_redis.set("k", "v")
    assert "ReadOnlyError" in unreachable_reason(caught.value)
    own_redis.execute_command("REPLICAOF", "NO", "ONE")
    assert own_redis.set("k", "v")


def test_crawl_waits_out_redis_at_maxmemory(clean, own_redis) -> None:
    catalog = Catalog(products=80)
    url = f"redis://127.0.0.1:{own_redis.connection_pool.connection_kwargs['port']}/0"
    own_redis.config_set("maxmemory-policy", "noeviction")
    with DemoSite(catalog, delay_ms=40) as site:
        env = crawl_env(
            clean,
            REDIS_URL=url,
            DEMO_SITE_URL=site.url,
            CONCURRENT_REQUESTS="4",
            SCHEDULER_IDLE_TIMEOUT="3",
            SCHEDULER_LEASE_TIMEOUT="5",
        )
        crawl = start_crawl(env)
        wait_for(lambda: site.stats()["total"] > 30, timeout=60, step=0.05)
        own_redis.config_set("maxmemory", "1")
        full_at = site.stats()["total"]
        time.sleep(8)
        own_redis.config_set("maxmemory", "0")
        _out, log = crawl.communicate(timeout=180)
        counts = site.stats()["requests"]
    assert full_at < len(catalog.pages())  # Redis filled up mid-crawl
    assert crawl.returncode == 0, log[-3000:]
    assert "Traceback" not in log, log[-5000:]
    assert "Spider closed (finished)" in log
    assert "OutOfMemoryError" in log and "noeviction" in log, log[-3000:]
    assert re.search(r"'redis/write_refusals': [1-9]", log), log[-3000:]
    assert sorted(p for p in counts if p != "/robots.txt") == sorted(catalog.pages())
    assert_each_product_stored_or_rejected_once(clean.query, catalog)
