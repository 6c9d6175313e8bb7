"""Redis memory per URL of the two seen-state backends, their insert rates, and the Bloom
filter's measured false-positive rate: `.venv/bin/python bench/dupefilter_memory.py [--urls N]`.

For N URL fingerprints (SHA1 hex, as Scrapy's fingerprinter makes them) each backend claims
them all through its real claim script, pipelined 1,000 at a time, as ``add_many`` does:

* memory: ``MEMORY USAGE`` of the key, and the change of ``INFO memory`` ``used_memory`` and
  ``used_memory_dataset`` (read once no AOF rewrite runs);
* insert rate: claims per second, client included (one Python process, one connection), and
  the time Redis spent per claim in the script (``INFO commandstats``): the cost to the server
  every node shares;
* the Bloom filter (sized for exactly N URLs at ``--error-rate``): how many of the N it wrongly
  took for seen while filling up (pages a crawl would have skipped), and the false-positive rate
  once full, measured on ``--fresh`` never-inserted fingerprints against the stored bits.

Uses ``REDIS_URL`` when set, else an embedded Redis under a temporary folder, and only Redis
database 7 (tests use 8-15); it deletes only its own ``bench:seen:*`` keys. ``main()`` returns
the figures as a dict.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from scraper import backends  # noqa: E402
from scraper.queue.bloom import BloomFilter, BloomSeen  # noqa: E402
from scraper.queue.dupefilter import SeenSet  # noqa: E402

BENCH_REDIS_DB = 7
SET_KEY = "bench:seen:set"
BLOOM_KEY = "bench:seen:bloom"


def with_redis_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}?{urlencode({**dict(parse_qsl(parts.query)), 'db': str(db)})}"
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, ""))


def bench_redis() -> tuple[str, bool]:
    """(URL of database 7, embedded?)."""
    url = os.environ.get("REDIS_URL", "").strip()
    if url:
        backends.check_redis(url)
        return with_redis_db(url, BENCH_REDIS_DB), False
    # The project's own embedded Redis (same server configuration), without the Postgres
    # that backends.resolve would start too.
    embedded = backends._start_embedded_redis(Path(tempfile.mkdtemp(prefix="scraper-bench-")))
    return with_redis_db(embedded, BENCH_REDIS_DB), True


def fingerprints(count: int, salt: str) -> list[str]:
    return [hashlib.sha1(f"https://shop.example/{salt}/p/{i}".encode()).hexdigest() for i in range(count)]


def used_memory(server: Any) -> tuple[int, int]:
    """(used_memory, used_memory_dataset) once no AOF rewrite is running: a rewrite buffers
    every write meanwhile, which would count against whichever backend ran at the time."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        persistence = server.info("persistence")
        if not persistence.get("aof_rewrite_in_progress") and not persistence.get("aof_rewrite_scheduled"):
            break
        time.sleep(0.2)
    memory = server.info("memory")
    return int(memory["used_memory"]), int(memory["used_memory_dataset"])


def script_usec(server: Any) -> tuple[int, int]:
    """(calls, microseconds) Redis spent in EVALSHA so far (read, never reset: it may be shared)."""
    stats = server.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def measure(server: Any, store: Any, keys: list[str], urls: list[str]) -> dict[str, float]:
    memory_before, dataset_before = used_memory(server)
    calls_before, usec_before = script_usec(server)
    started = time.perf_counter()
    new = store.add_many(urls, chunk=1000)
    seconds = time.perf_counter() - started
    calls, usec = script_usec(server)
    memory, dataset = used_memory(server)
    return {
        "new": new,
        "seconds": seconds,
        "inserts_per_s": len(urls) / seconds,
        "server_usec_per_claim": (usec - usec_before) / max(1, calls - calls_before),
        "memory_usage_bytes": sum(int(server.memory_usage(key, samples=0) or 0) for key in keys),
        "used_memory_delta": memory - memory_before,
        "dataset_delta": dataset - dataset_before,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--urls", type=int, default=1_000_000)
    parser.add_argument("--error-rate", type=float, default=0.001)
    parser.add_argument("--fresh", type=int, default=None, help="fingerprints to measure false positives on (--urls)")
    args = parser.parse_args(argv)
    n, p = args.urls, args.error_rate

    url, embedded = bench_redis()
    server = redis.Redis.from_url(url)
    bloom = BloomFilter.for_capacity(n, p)
    keys = [SET_KEY, *bloom.slice_keys(BLOOM_KEY), f"{BLOOM_KEY}:params"]
    server.delete(*keys)
    version = server.info("server")["redis_version"]
    print(
        f"Redis {version} ({'embedded' if embedded else 'server'}), database {BENCH_REDIS_DB}; {n:,} URL fingerprints",
        flush=True,
    )
    urls = fingerprints(n, "seen")
    try:
        print("set: claiming ...", flush=True)
        as_set = measure(server, SeenSet(server, SET_KEY), [SET_KEY], urls)
        server.delete(SET_KEY)

        print(f"bloom (m={bloom.bits:,} bits, k={bloom.hashes}, {bloom.slices} slice(s)): claiming ...", flush=True)
        store = BloomSeen(server, BLOOM_KEY, bloom)
        as_bloom = measure(server, store, bloom.slice_keys(BLOOM_KEY), urls)
        estimated = store.size()

        print("bloom: measuring false positives ...", flush=True)
        # The slices end to end are the filter's bits in order (each full slice a whole number of bytes).
        bits = b"".join(
            (server.get(key) or b"").ljust(size // 8, b"\0")
            for key, size in zip(bloom.slice_keys(BLOOM_KEY), bloom.slice_sizes())
        ).ljust(bloom.bytes, b"\0")
        fresh = fingerprints(args.fresh or n, "fresh")
        false_positives = sum(all(bits[q >> 3] >> (7 - (q & 7)) & 1 for q in bloom.positions(fp)) for fp in fresh)
    finally:
        server.delete(*keys)

    figures = {
        "redis": f"{version} {'embedded' if embedded else 'server'}",
        "urls": n,
        "error_rate": p,
        "set_bytes_per_url": as_set["memory_usage_bytes"] / n,
        "set_used_memory_per_url": as_set["used_memory_delta"] / n,
        "set_dataset_per_url": as_set["dataset_delta"] / n,
        "set_inserts_per_s": as_set["inserts_per_s"],
        "set_server_usec_per_claim": as_set["server_usec_per_claim"],
        "set_missed": n - as_set["new"],
        "bloom_bits": bloom.bits,
        "bloom_hashes": bloom.hashes,
        "bloom_bytes_per_url": as_bloom["memory_usage_bytes"] / n,
        "bloom_used_memory_per_url": as_bloom["used_memory_delta"] / n,
        "bloom_bytes_per_url_expected": bloom.bytes_per_url,
        "bloom_dataset_per_url": as_bloom["dataset_delta"] / n,
        "bloom_inserts_per_s": as_bloom["inserts_per_s"],
        "bloom_server_usec_per_claim": as_bloom["server_usec_per_claim"],
        "bloom_missed_while_filling": (n - as_bloom["new"]) / n,
        "bloom_fp_rate_measured": false_positives / len(fresh),
        "bloom_fp_rate_expected": bloom.false_positive_rate(),
        "bloom_size_estimate": estimated,
    }
    print()
    print(f"{'':8}{'MEMORY USAGE':>14}{'used_memory':>13}{'dataset':>10}{'claims/s':>11}{'Redis µs':>10}")
    print(f"{'':8}{'bytes/URL':>14}{'bytes/URL':>13}{'bytes/URL':>10}{'':>11}{'per claim':>10}")
    for name in ("set", "bloom"):
        print(
            f"{name:8}{figures[f'{name}_bytes_per_url']:>14.2f}{figures[f'{name}_used_memory_per_url']:>13.2f}"
            f"{figures[f'{name}_dataset_per_url']:>10.2f}{figures[f'{name}_inserts_per_s']:>11,.0f}"
            f"{figures[f'{name}_server_usec_per_claim']:>10.1f}"
        )
    print(
        f"\nset / bloom memory: {figures['set_bytes_per_url'] / figures['bloom_bytes_per_url']:.0f}x; "
        f"bloom claims/s relative to set: {figures['bloom_inserts_per_s'] / figures['set_inserts_per_s']:.2f}x"
    )
    print(
        f"bloom false positives once full: {figures['bloom_fp_rate_measured']:.5f} measured on {len(fresh):,} "
        f"fresh URLs, {figures['bloom_fp_rate_expected']:.5f} expected"
    )
    print(
        f"bloom: {figures['bloom_missed_while_filling']:.5%} of the {n:,} URLs wrongly taken for seen while "
        f"filling; size estimate {estimated:,.0f}"
    )
    return figures


if __name__ == "__main__":
    main()
