"""The seen-state backends: a Bloom filter in Redis next to the set, fingerprint expiry, sizing."""

from __future__ import annotations

import json
import logging
import math
import random
import re
import time

import pytest
import redis
import scrapy
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler
from support.crawls import crawl, crawl_env, run_scrapy
from support.errors import check_one_line_error
from support.queue import queue_depth, queue_entries

from scraper.config import ConfigError
from scraper.demo_site import Catalog, DemoSite
from scraper.node.scheduler import SharedScheduler
from scraper.queue import signing
from scraper.queue.bloom import MAX_BITS, SLICE_BITS, BloomFilter, BloomSeen
from scraper.queue.dupefilter import SharedDupeFilter, make_store, seen_config, seen_size
from scraper.queue.generations import Generations
from scraper.queue.leases import Leases
from scraper.queue.queues import PriorityQueue

SPIDER = "bloom_test"


class BloomSpider(scrapy.Spider):
    name = SPIDER


class QueryBlindFingerprinter:
    """Takes ``/p?a=1`` and ``/p?a=2`` for the same page."""

    def fingerprint(self, request: scrapy.Request) -> bytes:
        return request.url.partition("?")[0].encode()


def settings_for(backend: str, **extra: str) -> Settings:
    return Settings(
        {
            "DUPEFILTER_BACKEND": backend,
            "DUPEFILTER_BLOOM_CAPACITY": "100000",
            "DUPEFILTER_BLOOM_ERROR_RATE": "0.001",
            **extra,
        }
    )


class Node:
    """What one crawl process holds: its own connection, dupefilter and queue."""

    def __init__(self, server: redis.Redis, settings: Settings) -> None:
        self.server = server
        self.queue = PriorityQueue(self.server, BloomSpider(), f"{{{SPIDER}}}:requests")
        crawler = get_crawler(BloomSpider, {"REQUEST_FINGERPRINTER_CLASS": "scrapy.utils.request.RequestFingerprinter"})
        self.df = SharedDupeFilter(
            self.server,
            f"{{{SPIDER}}}:dupefilter",
            crawler.request_fingerprinter,
            store=make_store(self.server, SPIDER, settings),
        )

    def offer(self, *urls: str) -> tuple[int, int]:
        """Enqueue as the scheduler does: local pre-check, staged, one pipelined flush."""
        for url in urls:
            request = scrapy.Request(url)
            seen, fp = self.df.seen_locally(request)
            if not seen:
                self.queue.stage(request, self.df, fp)
        return self.queue.flush_staged()


@pytest.fixture
def connect(clean):
    """New connections to the test database, as separate nodes would hold; closed afterwards
    (an embedded Redis only stops once no client is left)."""
    clients: list[redis.Redis] = []

    def new() -> redis.Redis:
        clients.append(redis.Redis.from_url(clean.redis_url))
        return clients[-1]

    yield new
    for client in clients:
        client.close()


def fingerprints(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [rng.randbytes(20).hex() for _ in range(count)]


# --- sizing -----------------------------------------------------------------------------------
@pytest.mark.parametrize("capacity, rate", [(10_000_000, 0.001), (200_000, 0.01), (1000, 0.5), (1, 0.001)])
def test_sizing_follows_the_textbook_formulas(capacity: int, rate: float) -> None:
    bloom = BloomFilter.for_capacity(capacity, rate)
    assert bloom.bits == math.ceil(-capacity * math.log(rate) / math.log(2) ** 2)
    assert bloom.hashes == max(1, round(bloom.bits / capacity * math.log(2)))
    if capacity > 100:
        assert bloom.false_positive_rate() == pytest.approx(rate, rel=0.05)


def test_default_filter_is_18_mb_at_1_8_bytes_per_url() -> None:
    bloom = seen_config(Settings({})).bloom
    assert (bloom.capacity, bloom.error_rate, bloom.hashes) == (10_000_000, 0.001, 10)
    assert bloom.bytes == pytest.approx(18e6, rel=0.01) and bloom.bytes_per_url == pytest.approx(1.797, abs=0.001)


def test_a_filter_beyond_one_redis_string_is_refused_by_name() -> None:
    refused = r"^DUPEFILTER_BLOOM_CAPACITY: 400000000 URLs .*at most (298\d{6}) URLs"
    with pytest.raises(ConfigError, match=refused) as info:
        seen_config(Settings({"DUPEFILTER_BACKEND": "bloom", "DUPEFILTER_BLOOM_CAPACITY": "400000000"}))
    most = re.search(r"at most (\d+)", str(info.value)).group(1)
    assert seen_config(Settings({"DUPEFILTER_BLOOM_CAPACITY": most})).bloom.bits <= MAX_BITS


def test_positions_are_spread_and_distinct() -> None:
    bloom = BloomFilter.for_capacity(1000, 0.001)
    for fp in fingerprints(200, 1):
        positions = bloom.positions(fp)
        assert len(positions) == bloom.hashes and all(0 <= p < bloom.bits for p in positions)
        assert len(set(positions)) >= bloom.hashes - 1


def test_a_fingerprint_is_forgotten_between_half_the_expiry_and_the_expiry() -> None:
    generations = Generations(None, expiry=600)
    for t in (0.0, 299.999, 300.0, 1_700_000_123.4, 1_700_000_399.9):
        generation = int(t // generations.half)
        forgotten_at = generations.expire_at_ms(generation) / 1000
        assert 300 < forgotten_at - t <= 600


# --- claims: atomic, shared by nodes ------------------------------------------------------------
@pytest.mark.parametrize("backend", ["set", "bloom"])
def test_two_nodes_queue_a_link_once(connect, backend: str) -> None:
    a, b = Node(connect(), settings_for(backend)), Node(connect(), settings_for(backend))
    assert a.offer("http://shop.test/1", "http://shop.test/2", "http://shop.test/1") == (2, 0)
    assert b.offer("http://shop.test/2", "http://shop.test/3") == (1, 1)
    assert queue_depth(a.queue.server, a.queue.key) == 3
    # request_seen, Scrapy's own entry point, answers from the same state.
    c = Node(connect(), settings_for(backend))
    assert c.df.request_seen(scrapy.Request("http://shop.test/3"))
    assert not c.df.request_seen(scrapy.Request("http://shop.test/4"))
    assert b.offer("http://shop.test/4") == (0, 1)


@pytest.mark.parametrize("backend", ["set", "bloom"])
def test_a_big_flush_queues_exactly_the_links_no_node_had(connect, backend: str) -> None:
    """A page's links go in one flush (for the set, one script call for all of them): each is
    answered on its own, whichever other node claimed which."""
    a, b = Node(connect(), settings_for(backend)), Node(connect(), settings_for(backend))
    assert b.offer(*[f"http://shop.test/{i}" for i in range(0, 300, 2)]) == (150, 0)
    for i in range(300):
        request = scrapy.Request(f"http://shop.test/{i}")
        a.queue.stage(request, a.df, a.df.seen_locally(request)[1])
    a.queue.stage(scrapy.Request("http://shop.test/again", dont_filter=True))
    assert a.queue.flush_staged() == (151, 150)
    queued = [json.loads(signing.unwrap(m))["url"] for m in queue_entries(a.queue.server, a.queue.key)]
    assert sorted(queued) == sorted([f"http://shop.test/{i}" for i in range(300)] + ["http://shop.test/again"])
    assert b.offer("http://shop.test/1", "http://shop.test/301") == (1, 1)


@pytest.mark.parametrize("backend", ["set", "bloom"])
def test_racing_nodes_claim_each_fingerprint_exactly_once(connect, backend: str) -> None:
    import threading

    shared = fingerprints(3000, 2)
    stores = [make_store(connect(), SPIDER, settings_for(backend)) for _ in range(3)]
    new = [0] * len(stores)

    def claim(i: int) -> None:
        mine = shared[:]
        random.Random(i).shuffle(mine)
        new[i] = stores[i].add_many(mine, chunk=100)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # At 3,000 of 100,000 URLs the filter's false-positive rate is ~1e-13: none expected.
    assert sum(new) == len(shared)
    assert stores[0].size() == pytest.approx(len(shared), rel=0.02)


# --- the Bloom filter's error rate, measured --------------------------------------------------
def test_measured_false_positive_rate_is_near_the_configured_rate(connect) -> None:
    server = connect()
    bloom = BloomFilter.for_capacity(50_000, 0.01)
    store = BloomSeen(server, f"{{{SPIDER}}}:bloom", bloom)
    inserted = fingerprints(50_000, 3)
    new = store.add_many(inserted, chunk=5000)
    # Filling up, a few late fingerprints already collide: far fewer than 1% of them.
    assert len(inserted) - new < 0.01 * len(inserted)
    # Check the stored bits here rather than with 1.4 million GETBITs (bit 0 is the first byte's MSB).
    bits = server.get(f"{{{SPIDER}}}:bloom").ljust(bloom.bytes, b"\0")

    def held(fp: str) -> bool:
        return all(bits[p >> 3] >> (7 - (p & 7)) & 1 for p in bloom.positions(fp))

    assert all(held(fp) for fp in inserted[::50])  # no false negatives
    fresh = fingerprints(200_000, 4)
    rate = sum(held(fp) for fp in fresh) / len(fresh)
    assert 0.005 <= rate <= 0.02, rate
    # The size estimate from the share of bits set, counted in full and from a sample.
    assert store.size() == pytest.approx(len(inserted), rel=0.02)
    store.SAMPLE_BYTES = 8 * 1024
    assert store.size() == pytest.approx(len(inserted), rel=0.05)


def test_size_never_fails_on_a_key_of_another_type(connect) -> None:
    server = connect()
    server.set(f"{{{SPIDER}}}:dupefilter", "not a set")
    assert seen_size(server, SPIDER, Settings({})) == 0
    assert seen_size(server, SPIDER, settings_for("bloom")) == 0  # no filter yet
    server.delete(f"{{{SPIDER}}}:dupefilter")
    make_store(server, SPIDER, settings_for("set")).add_many(fingerprints(50, 5))
    assert seen_size(server, SPIDER, Settings({})) == 50


def test_a_node_configured_otherwise_uses_the_filter_in_redis(connect, caplog) -> None:
    first = make_store(connect(), SPIDER, settings_for("bloom", DUPEFILTER_BLOOM_CAPACITY="1000"))
    first.add_many(fingerprints(100, 6))
    with caplog.at_level(logging.WARNING):
        second = make_store(connect(), SPIDER, settings_for("bloom", DUPEFILTER_BLOOM_CAPACITY="2000"))
        assert second.add_many(fingerprints(100, 6)) == 0
    assert second.bloom == first.bloom and "uses the stored shape" in caplog.text


# --- expiry -----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["set", "bloom"])
def test_fingerprints_expire_and_the_page_is_queued_again(connect, backend: str) -> None:
    node = Node(connect(), settings_for(backend, DUPEFILTER_EXPIRY="2"))
    assert node.offer("http://shop.test/old") == (1, 0)
    generations = node.df.store.generations
    forgotten_at = generations.expire_at_ms(generations.current()) / 1000
    other = Node(connect(), settings_for(backend, DUPEFILTER_EXPIRY="2"))
    assert other.offer("http://shop.test/old") == (0, 1)
    server = connect()
    live = [k for k in node.df.store.keys() if server.exists(k)]
    assert live and all(0 < server.pttl(k) <= 2000 for k in live), {k: server.pttl(k) for k in live}
    assert not node.df.run_keys()  # kept past a finished crawl: they expire on their own
    time.sleep(max(0.0, forgotten_at - generations.now()) + 0.05)
    # Forgotten by Redis and by the node's own local pre-check.
    assert node.offer("http://shop.test/old") == (1, 0)
    assert other.offer("http://shop.test/old") == (0, 1)


# --- through the real scheduler and crawler -------------------------------------------------
def test_custom_request_fingerprinter_is_honoured(clean, connect) -> None:
    def scheduler() -> SharedScheduler:
        crawler = get_crawler(
            BloomSpider,
            {
                "REQUEST_FINGERPRINTER_CLASS": QueryBlindFingerprinter,
                "REDIS_URL": clean.redis_url,
                "DUPEFILTER_BACKEND": "bloom",
                "DUPEFILTER_BLOOM_CAPACITY": "1000",
                "SCHEDULER_LEASE_TIMEOUT": "0",
            },
        )
        instance = SharedScheduler.from_crawler(crawler)
        instance.open(BloomSpider())
        return instance

    first, second = scheduler(), scheduler()
    assert first.enqueue_request(scrapy.Request("http://shop.test/p?a=1"))
    assert not first.enqueue_request(scrapy.Request("http://shop.test/p?a=2"))  # the local pre-check
    first.flush_staged()
    assert second.enqueue_request(scrapy.Request("http://shop.test/p?a=3"))  # staged, then refused by Redis
    second.flush_staged()
    assert second.stats.get_value("dupefilter/filtered_shared") == 1
    assert queue_depth(connect(), f"{{{SPIDER}}}:requests") == 1
    assert connect().exists(f"{{{SPIDER}}}:bloom") and not connect().exists(f"{{{SPIDER}}}:dupefilter")
    for instance in (first, second):
        instance.close("shutdown")


def test_an_expired_lease_is_redelivered_past_the_filter(connect) -> None:
    node = Node(connect(), settings_for("bloom"))
    assert node.offer("http://shop.test/leased") == (1, 0)
    leases = Leases(node.server, SPIDER, node.queue.key, f"{{{SPIDER}}}:dead", ttl=0.1)
    [(_lease, _score, _data)] = leases.take(1)
    time.sleep(0.2)
    assert leases.reap() == (1, 0)
    assert queue_depth(node.server, node.queue.key) == 1
    other = Node(connect(), settings_for("bloom"))
    assert other.offer("http://shop.test/leased") == (0, 1)  # still seen: only a redelivery gets past


def test_crawl_with_the_bloom_filter_fetches_each_page_once(clean, connect, site: DemoSite, catalog: Catalog) -> None:
    crawl(clean, site, DUPEFILTER_BACKEND="bloom")
    counts = site.stats()["requests"]
    pages = {p: n for p, n in counts.items() if p != "/robots.txt"}
    assert sorted(pages) == sorted(catalog.pages()) and set(pages.values()) == {1}
    rows = clean.query("SELECT sku, count(*) FROM products GROUP BY sku")
    assert sorted(sku for sku, _ in rows) == sorted(p.sku for p in catalog.valid_products())
    assert all(n == 1 for _, n in rows)
    # A finished crawl without expiry drops its filter with the rest of the run's state (the URL
    # aliases it learnt are kept for the next runs).
    assert [k for k in connect().keys("{demo}:*") if not k.startswith(b"{demo}:run")] == [b"{demo}:aliases"]


def test_with_an_expiry_a_recrawl_skips_what_it_saw(clean, connect, site: DemoSite, catalog: Catalog) -> None:
    crawl(clean, site, DUPEFILTER_BACKEND="bloom", DUPEFILTER_EXPIRY="3600")
    server = connect()
    kept = sorted(
        k.decode() for k in server.keys("{demo}:*") if not k.startswith(b"{demo}:run") and k != b"{demo}:aliases"
    )
    assert kept and all(k.startswith("{demo}:bloom:") for k in kept), kept
    assert all(0 < server.ttl(k) <= 3600 for k in kept)
    # `scrapy queue` estimates the filter's size (from a 1 MB sample of 18 MB: rough when small).
    result = run_scrapy(
        crawl_env(clean, DEMO_SITE_URL=site.url, DUPEFILTER_BACKEND="bloom", DUPEFILTER_EXPIRY="3600"),
        "queue",
        "demo",
        "--json",
        "--interval",
        "0.1",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert row["seen"] == pytest.approx(len(catalog.pages()), rel=0.3)
    site.reset_stats()
    crawl(clean, site, DUPEFILTER_BACKEND="bloom", DUPEFILTER_EXPIRY="3600")
    assert [p for p in site.stats()["requests"] if p != "/robots.txt"] == []


# --- configuration --------------------------------------------------------------------------
def test_bad_dupefilter_settings_fail_at_start_with_one_line(clean) -> None:
    line = check_one_line_error(
        run_scrapy(crawl_env(clean, DUPEFILTER_BACKEND="bogus"), "crawl", "demo"), "DUPEFILTER_BACKEND"
    )
    assert "'bogus'" in line
    check_one_line_error(
        run_scrapy(crawl_env(clean, DUPEFILTER_BACKEND="bloom", DUPEFILTER_BLOOM_ERROR_RATE="2"), "crawl", "demo"),
        "DUPEFILTER_BLOOM_ERROR_RATE",
    )
    for shards in ("0", "many", "5000"):
        check_one_line_error(run_scrapy(crawl_env(clean, SCHEDULER_SHARDS=shards), "crawl", "demo"), "SCHEDULER_SHARDS")


# --- slices -----------------------------------------------------------------------------------
def test_a_filter_beyond_a_slice_is_kept_in_slices_each_filling_an_allocator_class(connect) -> None:
    server = connect()
    bloom = BloomFilter.for_capacity(1_000_000, 0.001)  # 1,797,199 bytes: a full slice and a part
    base = f"{{{SPIDER}}}:bloom"
    store = BloomSeen(server, base, bloom)
    assert bloom.slice_keys(base) == [base, f"{base}#1"]
    store.generation()  # opened: allocated whole
    assert [server.strlen(k) for k in bloom.slice_keys(base)] == [SLICE_BITS // 8, bloom.bytes - SLICE_BITS // 8]
    assert server.hget(f"{base}:params", "layout") == b"blake2b128-edh-sliced"
    # Each slice takes one block of its allocator class, not the next class up: a full slice (its
    # bytes, the string's header and terminator) is one 1 MiB block; the filter as a whole wastes
    # no more than the last slice's rounding.
    assert server.memory_usage(base, samples=0) <= 2**20 + 128
    total = sum(server.memory_usage(k, samples=0) for k in store.keys())
    assert total / bloom.capacity <= 1.05 * bloom.bytes_per_url, total

    inserted = fingerprints(30_000, 11)
    assert store.add_many(inserted, chunk=5000) == len(inserted)  # 3% of capacity: no collision
    assert store.add_many(inserted[::7]) == 0  # every one remembered, whichever slice holds its bits
    # Bits landed in both slices in proportion to their sizes, none past a slice's end.
    ones = [server.bitcount(k) for k in bloom.slice_keys(base)]
    sizes = bloom.slice_sizes()
    assert ones[0] / sizes[0] == pytest.approx(ones[1] / sizes[1], rel=0.1), ones
    assert [server.strlen(k) for k in bloom.slice_keys(base)] == [SLICE_BITS // 8, bloom.bytes - SLICE_BITS // 8]
    fresh = fingerprints(20_000, 12)
    assert store.add_many(fresh, chunk=5000) == len(fresh)
    assert store.size() == pytest.approx(len(inserted) + len(fresh), rel=0.03)
    store.SAMPLE_BYTES = 64 * 1024  # sampled: a stretch of each slice
    assert store.size() == pytest.approx(len(inserted) + len(fresh), rel=0.15)

    store.clear()
    assert not [k for k in server.scan_iter(match=f"{base}*")]


def test_every_slice_of_a_generation_expires_with_it(connect) -> None:
    server = connect()
    store = make_store(
        server, SPIDER, settings_for("bloom", DUPEFILTER_BLOOM_CAPACITY="1000000", DUPEFILTER_EXPIRY="600")
    )
    assert store.add_many(fingerprints(100, 13)) == 100
    keys = [k for k in store.keys() if not k.endswith(":params")]
    assert len(keys) == 2 * 2  # two slices of the current generation and of the one before
    live = [k for k in keys if server.exists(k)]
    assert len(live) == 2 and all(0 < server.pttl(k) <= 600_000 for k in live), live
    assert 0 < server.pttl(f"{{{SPIDER}}}:bloom:params") <= 600_000


def _unsliced_params(server: redis.Redis, base: str, old: BloomFilter) -> None:
    """The parameters a version before slicing wrote."""
    server.hset(
        f"{base}:params",
        mapping={
            "bits": old.bits,
            "hashes": old.hashes,
            "capacity": old.capacity,
            "error_rate": repr(old.error_rate),
            "expiry": "0.0",
            "layout": "blake2b128-edh",
        },
    )


def test_a_filter_made_before_slicing_is_read_as_one_key(connect) -> None:
    server = connect()
    base = f"{{{SPIDER}}}:bloom"
    old = BloomFilter.for_capacity(1_000_000, 0.001)
    _unsliced_params(server, base, old)
    # Its bits as that version set them: each position in the one string.
    seen = fingerprints(2000, 14)
    pipe = server.pipeline(transaction=False)
    for fp in seen:
        for position in old.positions(fp):
            pipe.setbit(base, position, 1)
    pipe.execute()
    store = make_store(server, SPIDER, settings_for("bloom", DUPEFILTER_BLOOM_CAPACITY="1000000"))
    assert store.add_many(seen) == 0  # remembered
    assert store.add_many(fingerprints(2000, 15)) == 2000
    assert store.bloom.slices == 1 and not server.exists(f"{base}#1")
    assert server.strlen(base) == old.bytes


def test_nodes_agree_on_the_filter_once_a_run_start_dropped_the_one_made_before_slicing(connect) -> None:
    # The fleet upgraded after a finished run: the first node opens the old one-key filter,
    # then its run's start drops it (a finished run's seen-state). Every node must then use the
    # filter the next opener makes, not the shape it opened first.
    server = connect()
    base = f"{{{SPIDER}}}:bloom"
    old = BloomFilter.for_capacity(1_000_000, 0.001)
    _unsliced_params(server, base, old)
    server.setbit(base, old.bits - 1, 0)
    settings = settings_for("bloom", DUPEFILTER_BLOOM_CAPACITY="1000000")
    first = Node(connect(), settings)
    assert first.df.store.bloom.slices == 1  # opened as it was
    server.delete(*first.df.run_keys())  # what the run's start does with a finished run's keys
    first.df.begun()
    second = Node(connect(), settings)
    links = [f"https://shop.test/p/{n}" for n in range(300)]
    assert first.offer(*links)[0] == 300
    assert second.offer(*links)[0] == 0  # every one already claimed by the first node
    assert first.df.store.bloom.slices == second.df.store.bloom.slices == 2
    assert server.strlen(base) == SLICE_BITS // 8  # the first slice, not the one-key filter grown back


def test_a_filter_deleted_unopened_goes_with_all_its_slices(connect) -> None:
    # A store built from settings for a smaller filter than the one in Redis (its shape not read
    # yet, as a shard's store is when the run's start drops its keys): every slice goes.
    server = connect()
    big = make_store(server, SPIDER, settings_for("bloom", DUPEFILTER_BLOOM_CAPACITY="2000000"))
    assert big.add_many(fingerprints(100, 16)) == 100
    slices = big.bloom.slice_keys(big.base)
    assert len(slices) == 4 and all(server.exists(k) for k in slices)
    small = make_store(server, SPIDER, settings_for("bloom", DUPEFILTER_BLOOM_CAPACITY="100000"))
    server.delete(*small.run_keys())
    assert not [k for k in server.scan_iter(match=f"{big.base}*")]
