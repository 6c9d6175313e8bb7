"""The whole pipeline on a real local Redis Cluster (3 masters + 3 replicas), and a failover.

Every key of a spider carries its hash tag (``{demo}:...``), so one spider's queue, leases,
seen-set, runs and dead letters share one slot (one master); the politeness keys are per domain
and land wherever their domain hashes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from support.crawls import Services, assert_each_product_stored_or_rejected_once, crawl_env, run_scrapy, run_scrapy_many
from support.processes import start_crawl, wait_for
from support.queue import queue_depth
from support.redis_cluster import LocalCluster

from scraper.demo_site import Catalog, DemoSite


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    running = LocalCluster().start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def on_cluster(clean: Services, cluster: LocalCluster) -> Services:
    cluster.wait_ok()
    cluster.flushall()
    return Services(cluster.url, clean.database_url)


@pytest.fixture
def doomed_cluster(clean: Services) -> Iterator[tuple[Services, LocalCluster]]:
    """A cluster of its own, for a test that kills one of its masters."""
    running = LocalCluster().start()
    try:
        yield Services(running.url, clean.database_url), running
    finally:
        running.stop()


def spider_keys(cluster: LocalCluster) -> dict[int, list[bytes]]:
    return {port: [k for k in names if k.startswith(b"{demo}")] for port, names in cluster.keys_by_master().items()}


def test_two_workers_crawl_the_demo_shop_through_a_cluster(on_cluster: Services, cluster: LocalCluster) -> None:
    catalog = Catalog(products=120)
    with DemoSite(catalog, delay_ms=20) as site:
        # Fleet-wide politeness on: its scripts run on the master of the site's own tag.
        env = crawl_env(
            on_cluster,
            DEMO_SITE_URL=site.url,
            CONCURRENT_REQUESTS="8",
            POLITENESS_CONCURRENCY="6",
            POLITENESS_RATE="500",
        )
        workers = run_scrapy_many(env, ("crawl", "demo"), ("crawl", "demo"), timeout=240)
        counts = site.stats()["requests"]
    for worker in workers:
        assert worker.returncode == 0, worker.stderr[-3000:]
        assert "Traceback" not in worker.stderr, worker.stderr[-3000:]
    assert any("Spider closed (finished)" in w.stderr for w in workers)
    # Every page was fetched exactly once between the two workers.
    pages = {p: n for p, n in counts.items() if p != "/robots.txt"}
    assert sorted(pages) == sorted(catalog.pages()) and max(pages.values()) == 1
    assert_each_product_stored_or_rejected_once(on_cluster.query, catalog)

    # The spider's keys (the run's record, its figures) sit on the one master of its hash slot.
    home = cluster.master_of("{demo}")
    where = spider_keys(cluster)
    assert where[home] and all(not names for port, names in where.items() if port != home), where
    run = cluster.node(home).hgetall("{demo}:run")
    assert run[b"state"] == b"finished", run

    # The operator commands read the same keys through the cluster.
    queue = run_scrapy(env, "queue", "demo", "--json")
    assert queue.returncode == 0, queue.stderr[-2000:]
    assert json.loads(queue.stdout.strip().splitlines()[-1])["depth"] == 0
    runs = run_scrapy(env, "runs", "demo", "--json")
    assert runs.returncode == 0 and '"state": "finished"' in runs.stdout, runs.stderr[-2000:]
    letters = run_scrapy(env, "dlq", "list", "demo")
    assert letters.returncode == 0 and "0 in all for 'demo'" in letters.stdout, letters.stderr[-2000:]


def test_a_sharded_frontier_spreads_one_spider_over_every_master(on_cluster: Services, cluster: LocalCluster) -> None:
    """SCHEDULER_SHARDS=3: three shops on three hosts (127.0.0.1-3, loopback), whose domains land
    in three shards, one per master; two workers crawl them all, each page once."""
    from scraper.queue.shards import Shards

    shards = Shards("demo", 3)
    catalog = Catalog(products=60)
    with (
        DemoSite(catalog, delay_ms=80) as one,
        DemoSite(catalog, host="127.0.0.2", delay_ms=80) as two,
        DemoSite(catalog, host="127.0.0.3", delay_ms=80) as three,
    ):
        sites = (one, two, three)
        assert sorted(shards.of_url(site.url) for site in sites) == [0, 1, 2]
        # The Bloom backend here (the set one in the other tests): one filter per shard, each of
        # two slices (a third of the capacity each: a million URLs at 0.1 %), in its shard's slot.
        env = crawl_env(
            on_cluster,
            DEMO_SITE_URL=one.url,
            CONCURRENT_REQUESTS="8",
            SCHEDULER_SHARDS="3",
            DUPEFILTER_BACKEND="bloom",
            DUPEFILTER_BLOOM_CAPACITY="3000000",
        )
        seeded = run_scrapy(env, "seed", "demo", two.url, three.url)
        assert seeded.returncode == 0 and "queued 2 start URL(s)" in seeded.stdout, seeded.stderr[-2000:]
        workers = [start_crawl(env) for _ in range(2)]
        # While they crawl, each master holds one shard: its queue, leases and seen-set.
        spread = wait_for(lambda: _shards_on_masters(cluster, shards), timeout=60, step=0.1)
        sliced = [k for names in cluster.keys_by_master().values() for k in names if k.endswith(b":bloom#1")]
        logs = [w.communicate(timeout=240)[1] for w in workers]
        counts = [site.stats()["requests"] for site in sites]
    for worker, log in zip(workers, logs):
        assert worker.returncode == 0, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    assert len(spread) == 3, spread
    assert len(sliced) == 3, sliced  # each shard's filter in two slices
    for requests in counts:
        pages = {p: n for p, n in requests.items() if p != "/robots.txt"}
        assert sorted(pages) == sorted(catalog.pages()) and max(pages.values()) == 1
    # The three shops sell the same products: each stored once, the copies counted as duplicates.
    assert_each_product_stored_or_rejected_once(on_cluster.query, catalog)
    run = cluster.node(cluster.master_of("{demo}")).hgetall("{demo}:run")
    assert run[b"state"] == b"finished" and run[b"shards"] == b"3", run
    # Finished: the shards' seen-sets were dropped with the run, nothing is left queued or leased.
    assert not [k for names in cluster.keys_by_master().values() for k in names if k.startswith(b"{demo/")]


def _shards_on_masters(cluster: LocalCluster, shards) -> dict[int, str]:
    found = {}
    for port, names in cluster.keys_by_master().items():
        tags = {n.split(b"}")[0].decode() + "}" for n in names if n.startswith(b"{demo/")}
        if tags:
            found[port] = ",".join(sorted(tags))
    return found if len(found) == 3 else {}


def test_keys_of_an_earlier_version_are_renamed_once(clean: Services) -> None:
    from scraper.backends.redis_client import get_redis
    from scraper.queue import keys

    server = get_redis(clean.redis_url)
    server.zadd("demo:requests", {b'{"url": "http://127.0.0.1/a"}': 1})
    server.hset("demo:run", mapping={"id": 4, "state": "stopped"})
    server.sadd("demo:dupefilter:19", "fp")
    server.set("demo_other:requests", "not ours")  # another spider whose name starts alike
    server.hset("{demo}:nodes", "n", 1)  # a tagged key already there is never overwritten
    server.hset("demo:nodes", "old", 1)

    assert keys.migrate_legacy(server, "demo") == 3
    assert queue_depth(server, "{demo}:requests") == 1 and server.hget("{demo}:run", "id") == b"4"
    assert server.smembers("{demo}:dupefilter:19") == {b"fp"}
    assert server.exists("demo_other:requests") and server.hgetall("{demo}:nodes") == {b"n": b"1"}
    assert server.exists("demo:nodes")
    assert keys.migrate_legacy(server, "demo") == 0

    # `scrapy queue` renames them too, so the first command after an upgrade shows the old queue.
    server.zadd("demo:requests", {b'{"url": "http://127.0.0.1/b"}': 1})
    server.delete("{demo}:requests")
    shown = run_scrapy(crawl_env(clean), "queue", "demo", "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert json.loads(shown.stdout.strip().splitlines()[-1])["depth"] == 1


def test_a_master_killed_mid_crawl_fails_over_with_nothing_lost(doomed_cluster: tuple[Services, LocalCluster]) -> None:
    on_cluster, cluster = doomed_cluster
    catalog = Catalog(products=240)
    home = cluster.master_of("{demo}")
    with DemoSite(catalog, delay_ms=60) as site:
        env = crawl_env(
            on_cluster,
            DEMO_SITE_URL=site.url,
            CONCURRENT_REQUESTS="8",
            SCHEDULER_LEASE_TIMEOUT="5",
            SCHEDULER_IDLE_TIMEOUT="5",
        )
        workers = [start_crawl(env) for _ in range(2)]
        wait_for(lambda: site.stats()["total"] > 60, timeout=90)
        cluster.kill(home)  # SIGKILL: no goodbye to the cluster; its replica is promoted
        logs = [w.communicate(timeout=300)[1] for w in workers]
        counts = site.stats()["requests"]
    for worker, log in zip(workers, logs):
        assert worker.returncode == 0, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    assert any("Spider closed (finished)" in log for log in logs)
    assert any("Redis unreachable" in log for log in logs), "the kill went unnoticed"

    # The spider's slot now lives on the promoted replica, which holds the whole crawl's state.
    cluster.wait_ok()
    new_home = cluster.master_of("{demo}")
    assert new_home != home
    node = cluster.node(new_home)
    assert node.hget("{demo}:run", "state") == b"finished"
    assert node.llen("{demo}:dead") == 0 and node.zcard("{demo}:lease_deadlines") == 0
    # Every page fetched, every product stored exactly once; a page fetched twice only when
    # its lease's acknowledgement was lost with the dead master (a redelivery, never a loss).
    pages = {p: n for p, n in counts.items() if p != "/robots.txt"}
    assert sorted(pages) == sorted(catalog.pages())
    assert max(pages.values()) <= 2
    assert_each_product_stored_or_rejected_once(on_cluster.query, catalog)


def test_a_run_keeps_its_shard_count_and_takes_in_unsharded_requests(clean: Services) -> None:
    """On a single Redis too: a stopped sharded run resumes sharded whatever the new node says,
    and requests seeded unsharded are moved into the shards of a sharded run."""
    catalog = Catalog(products=30)
    with DemoSite(catalog) as site:
        # Seeded unsharded, crawled with 3 shards: moved in, crawled once.
        seeded = run_scrapy(crawl_env(clean), "seed", "demo", site.url)
        assert seeded.returncode == 0, seeded.stderr[-2000:]
        first = run_scrapy(crawl_env(clean, DEMO_SITE_URL=site.url, SCHEDULER_SHARDS="3"), "crawl", "demo")
        assert first.returncode == 0, first.stderr[-3000:]
        assert "Moved 1 requests queued unsharded into the 3 shards of demo's frontier" in first.stderr
        assert "Spider closed (finished)" in first.stderr and "Traceback" not in first.stderr
        pages = {p: n for p, n in site.stats()["requests"].items() if p != "/robots.txt"}
        # The seed's claim stayed in the unsharded seen-set, so the spider's own start request
        # for the same page was new to its shard: that page, and only it, was fetched twice.
        assert sorted(pages) == sorted(catalog.pages()) and {p for p, n in pages.items() if n > 1} == {"/"}
        assert clean.redis().hget("{demo}:run", "shards") == b"3"

        # A stopped run of 3 shards, resumed by a node configured for 1: it keeps 3, and says so.
        server = clean.redis()
        seeded = run_scrapy(crawl_env(clean, SCHEDULER_SHARDS="3"), "seed", "demo", site.url + "?again=1")
        assert seeded.returncode == 0, seeded.stderr[-2000:]
        server.hset("{demo}:run", mapping={"id": 2, "state": "stopped", "shards": 3})
        assert queue_depth(server, "{demo}:requests") == 0  # in a shard, not in the unsharded queue
        second = run_scrapy(crawl_env(clean, DEMO_SITE_URL=site.url), "crawl", "demo")
    assert second.returncode == 0, second.stderr[-3000:]
    assert (
        second.stderr.count("SCHEDULER_SHARDS=1 not applied: the current run of demo has its frontier in 3 shards") == 1
    ), second.stderr[-3000:]
    assert "resuming run 2 of demo (1 queued)" in second.stderr, second.stderr[-3000:]
    assert "Spider closed (finished)" in second.stderr
    assert_each_product_stored_or_rejected_once(clean.query, catalog)

    # --fresh discards a stopped sharded run with its shards, and the new run takes the setting.
    with DemoSite(catalog) as site:
        seeded = run_scrapy(crawl_env(clean, SCHEDULER_SHARDS="3"), "seed", "demo", site.url + "?third=1")
        assert seeded.returncode == 0, seeded.stderr[-2000:]
        server.hset("{demo}:run", mapping={"id": 3, "state": "stopped", "shards": 3})
        third = run_scrapy(crawl_env(clean, DEMO_SITE_URL=site.url), "crawl", "demo", "--fresh")
    assert third.returncode == 0, third.stderr[-3000:]
    assert (
        "Discarded the 3 shards of the current run of demo (--fresh): 1 queued or leased requests dropped"
        in third.stderr
    ), third.stderr[-3000:]
    assert "SCHEDULER_SHARDS=1 not applied" not in third.stderr
    assert server.hget("{demo}:run", "shards") == b"1" and server.hget("{demo}:run", "id") == b"4"
    assert not [k for k in server.keys("{demo/*")], server.keys("*")


def test_a_sharded_crawl_survives_the_failover_of_a_shards_master(
    doomed_cluster: tuple[Services, LocalCluster],
) -> None:
    """The links a page yields may sit on another master than its lease: a lease is acknowledged
    only once a replica holds them, so a master dying with them unreplicated loses nothing."""
    on_cluster, cluster = doomed_cluster
    from scraper.queue.shards import Shards

    shards = Shards("demo", 3)
    catalog = Catalog(products=80)
    with (
        DemoSite(catalog, delay_ms=60) as one,
        DemoSite(catalog, host="127.0.0.2", delay_ms=60) as two,
        DemoSite(catalog, host="127.0.0.3", delay_ms=60) as three,
    ):
        sites = (one, two, three)
        # The master of a shard that is not the one of the run's own record.
        victim = next(
            port
            for port in (cluster.master_of(shards.queue_key(shards.of_url(s.url))) for s in sites)
            if port != cluster.master_of("{demo}")
        )
        env = crawl_env(
            on_cluster,
            DEMO_SITE_URL=one.url,
            CONCURRENT_REQUESTS="8",
            SCHEDULER_SHARDS="3",
            SCHEDULER_LEASE_TIMEOUT="5",
            SCHEDULER_IDLE_TIMEOUT="5",
        )
        seeded = run_scrapy(env, "seed", "demo", two.url, three.url)
        assert seeded.returncode == 0, seeded.stderr[-2000:]
        workers = [start_crawl(env) for _ in range(2)]
        wait_for(lambda: sum(s.stats()["total"] for s in sites) > 80, timeout=90)
        cluster.kill(victim)
        logs = [w.communicate(timeout=300)[1] for w in workers]
        counts = [site.stats()["requests"] for site in sites]
    for worker, log in zip(workers, logs):
        assert worker.returncode == 0, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    assert any("Redis unreachable" in log for log in logs), "the kill went unnoticed"
    cluster.wait_ok()
    for requests in counts:
        pages = {p: n for p, n in requests.items() if p != "/robots.txt"}
        assert sorted(pages) == sorted(catalog.pages()) and max(pages.values()) <= 2
    assert_each_product_stored_or_rejected_once(on_cluster.query, catalog)
    assert cluster.node(cluster.master_of("{demo}")).hget("{demo}:run", "state") == b"finished"
    # The acknowledgements waited for the replicas (WAIT on the masters that kept theirs).
    waits = sum(
        int(cluster.node(p).info("commandstats").get("cmdstat_wait", {}).get("calls", 0)) for p in cluster.masters()
    )
    assert waits > 0
