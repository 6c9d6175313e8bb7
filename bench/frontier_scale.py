"""The shared frontier at scale: Redis bytes per queued request and per seen URL, and a crawl
node's start, memory and speed, against the number of URLs queued (``bench/run.py --only
frontier_scale``, or this file alone).

The frontier is generated, not crawled: product URLs of 70 characters on a small site of the
bench's own, whose every ``/p/<i>-xxx.html`` page it makes from *i* when asked (a product page
the demo spider's ``parse_product`` reads). They are queued through the project's own path, as
a crawl or ``scrapy seed`` queues links: the spider's dupefilter claims each fingerprint
(``seen_locally``, then ``PriorityQueue.stage`` with it) and ``flush_staged`` sends them 100 at
a time, as the scheduler does, by several processes at once. Two frontiers grow side by side,
each in a private redis-server: one with the exact seen-set (``DUPEFILTER_BACKEND=set``), one
with a Bloom filter sized for the largest size (``bloom``); each size adds to the frontier of
the size before.

At each size: Redis ``used_memory`` per queued request (the Bloom filter's Redis, whose filter
was allocated whole before the first URL, so what grows is the queue) and per seen URL (the
set's Redis less the other: their queues hold the same entries), and ``MEMORY USAGE`` of each
key over its count; then one crawl node (``scrapy crawl demo``, ``CLOSESPIDER_PAGECOUNT``) on
each frontier, ``--repeat`` times in turn: seconds from its start to the site's first request,
its peak RSS (``VmHWM``), product pages/s and the Redis server's CPU per page.

    .venv/bin/python bench/frontier_scale.py --sizes 10000,1000000,10000000 --json /tmp/frontier.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
for _path in (ROOT, BENCH):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

SPIDER = "demo"
URL_LENGTH = 70
FLUSH_EVERY = 100  # the scheduler flushes its staged requests at 100 (or at the reactor's next turn)
SECRET = os.environ.get("SCHEDULER_SECRET", "bench-fleet-secret-0123456789")
DATABASE = "scraper_bench_frontier"
BACKENDS = ("set", "bloom")
_PRODUCT = re.compile(r"/p/([0-9]+)-x*\.html")


def product_url(origin: str, i: int) -> str:
    """The *i*-th product URL on the site at *origin*, padded to 70 characters."""
    head = f"{origin}/p/{i:08d}-"
    return head + "x" * max(0, URL_LENGTH - len(head) - len(".html")) + ".html"


# ---- the site: every product page made from its number --------------------------------------


def product_page(origin: str, i: int) -> bytes:
    """A product page with what the demo spider's ``parse_product`` selects."""
    title = f"Generated Kettle {i}"
    released = f"{1 + i % 28} Apr {2015 + i % 10}"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{title} | Frontier Shop</title>"
        f"<link rel='canonical' href='{product_url(origin, i)}'></head><body>\n"
        "<nav class='breadcrumb'><a href='/'>Home</a> › <a href='/c/kitchen/'>Kitchen</a></nav>\n"
        f"<main class='product-detail'><h1 class='title'>{title}</h1>\n"
        f"<p>SKU: <span class='sku'>FS-{i:09d}</span></p>\n"
        f"<p>Brand: <span class='brand'>Brand {i % 97}</span></p>\n"
        f"<p class='price-box'>Price: <span class='price'>${10 + i % 990}.99</span></p>\n"
        "<p><span class='availability'>In stock</span></p>\n"
        f"<p>Released: <time class='released'>{released}</time></p>\n"
        f"<img class='main' src='/img/{i}.jpg' alt='{title}'>\n"
        f"<div class='description'>{title}, generated for the frontier bench.</div>\n"
        "</main></body></html>\n"
    ).encode()


class ProductSite:
    """A threaded HTTP/1.1 server on a free port: robots.txt, an empty home page and every
    product page; it records when requests arrive (the shape ``page_states.node_start`` reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrivals: list[float] = []
        self._products: list[float] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.origin = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.url = self.origin + "/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ProductSite:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def record(self, product: bool) -> None:
        now = time.monotonic()
        with self._lock:
            self._arrivals.append(now)
            if product:
                self._products.append(now)

    def arrivals(self) -> list[float]:
        with self._lock:
            return list(self._arrivals)

    def product_arrivals(self) -> list[float]:
        with self._lock:
            return list(self._products)

    def reset_stats(self) -> None:
        with self._lock:
            self._arrivals.clear()
            self._products.clear()


def _handler(site: ProductSite) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a handshake per page would be most of its cost

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            match = _PRODUCT.fullmatch(path)
            site.record(match is not None)
            if match is not None:
                self._send(200, "text/html; charset=utf-8", product_page(site.origin, int(match[1])))
            elif path == "/robots.txt":
                self._send(200, "text/plain", b"User-agent: *\nAllow: /\n")
            elif path == "/":
                self._send(200, "text/html; charset=utf-8", b"<!DOCTYPE html><html><body>Frontier Shop</body></html>")
            else:
                self._send(404, "text/plain", b"not found")

        def _send(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


# ---- filling: one process per share of the range, each into both frontiers --------------------


def _frontier(url: str, backend: str, capacity: int, fingerprinter: Any, spider: Any) -> tuple[Any, Any]:
    """(queue, dupefilter) of the spider as its scheduler builds them, on the Redis at *url*."""
    from scrapy.settings import Settings

    from scraper.backends.redis_client import get_redis
    from scraper.queue import keys
    from scraper.queue.dupefilter import SharedDupeFilter, make_stores
    from scraper.queue.queues import PriorityQueue

    server = get_redis(url)
    settings = Settings({"DUPEFILTER_BACKEND": backend, "DUPEFILTER_BLOOM_CAPACITY": capacity})
    stores = make_stores(server, SPIDER, settings)
    seen = SharedDupeFilter(server, stores[0].base, fingerprinter, stores=stores)
    return PriorityQueue(server, spider, keys.queue_key(SPIDER)), seen


def _fill_range(urls: dict[str, str], origin: str, low: int, high: int, capacity: int, done: Any) -> None:
    """Queue products *low* to *high* - 1 in each frontier of *urls* (a process of its own)."""
    import scrapy

    from scraper.identity.fingerprint import IdentityFingerprinter
    from scraper.queue import signing
    from scraper.spiders.demo import DemoSpider

    signing._current = signing.Signer(SECRET)  # the crawl nodes' secret: they verify what they pop
    spider = DemoSpider()
    fingerprinter = IdentityFingerprinter()  # as `scrapy seed` builds it: no crawler, no spider policy
    frontiers = [_frontier(url, backend, capacity, fingerprinter, spider) for backend, url in urls.items()]
    for start in range(low, high, FLUSH_EVERY):
        stop = min(high, start + FLUSH_EVERY)
        for i in range(start, stop):
            request = scrapy.Request(product_url(origin, i), callback=spider.parse_product)
            for queue, seen in frontiers:
                known, fingerprint = seen.seen_locally(request)
                if not known:
                    queue.stage(request, seen, fingerprint)
        for queue, _ in frontiers:
            queue.flush_staged()
        with done.get_lock():
            done.value += stop - start


def fill(urls: dict[str, str], origin: str, low: int, high: int, capacity: int, workers: int) -> float:
    """Products *low* to *high* - 1 queued by *workers* processes; the seconds it took."""
    context = multiprocessing.get_context("spawn")  # the parent runs the site's threads: no fork
    done = context.Value("q", 0)
    step = -(-(high - low) // workers)
    procs = [
        context.Process(target=_fill_range, args=(urls, origin, s, min(high, s + step), capacity, done))
        for s in range(low, high, step)
    ]
    began = time.monotonic()
    for proc in procs:
        proc.start()
    last = began
    while any(p.is_alive() for p in procs):
        time.sleep(0.5)
        if time.monotonic() - last >= 30:
            last = time.monotonic()
            _progress(done.value, low, high, last - began)
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise SystemExit(f"frontier_scale: a filling process failed (exit {proc.exitcode})")
    return time.monotonic() - began


def _progress(done: int, low: int, high: int, seconds: float) -> None:
    rate = done / seconds if seconds else 0.0
    left = (high - low - done) / rate if rate else float("inf")
    print(f"  filling: {low + done:>12,} of {high:,} queued, {rate:,.0f} URLs/s, ~{left:.0f} s left", flush=True)


# ---- measuring -------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _used(server: Any) -> int:
    return int(server.info("memory")["used_memory"])


def memory(servers: dict[str, Any], bases: dict[str, int], claimed: int, bloom_keys: list[str]) -> dict[str, Any]:
    """Bytes per queued request and per seen URL on both frontiers (*claimed*: URLs claimed;
    *bloom_keys*: the Bloom filter's slices)."""
    from scraper.queue import keys
    from scraper.queue.lists import Lists, index_key, list_key

    out: dict[str, Any] = {"claimed": claimed}
    for backend, server in servers.items():
        seen_key = keys.bloom_key(SPIDER) if backend == "bloom" else keys.dupefilter_key(SPIDER)
        seen_keys = bloom_keys if backend == "bloom" else [seen_key]
        queue = Lists(server)
        first = server.zrange(index_key(keys.queue_key(SPIDER)), 0, 0)
        out[backend] = {
            "queued": int(queue.length(keys.queue_key(SPIDER))),
            "used_memory": _used(server) - bases[backend],
            "queue_memory_usage": queue.memory_usage(keys.queue_key(SPIDER)),
            "seen_memory_usage": sum(int(server.memory_usage(k, samples=0) or 0) for k in seen_keys),
            "seen_count": int(server.scard(seen_key)) if backend == "set" else claimed,
            "encoding": _text(server.object("encoding", list_key(keys.queue_key(SPIDER), first[0])) if first else None),
        }
    bloom, plain = out["bloom"], out["set"]
    # The Bloom filter was allocated before the first URL: what grew in its Redis is the queue.
    out["used_memory_per_request"] = bloom["used_memory"] / bloom["queued"]
    out["memory_usage_per_request"] = bloom["queue_memory_usage"] / bloom["queued"]
    # The set's Redis holds the same queue entries besides its set.
    per_queued = out["used_memory_per_request"]
    out["set_used_memory_per_seen"] = (plain["used_memory"] - per_queued * plain["queued"]) / plain["seen_count"]
    out["set_memory_usage_per_seen"] = plain["seen_memory_usage"] / plain["seen_count"]
    out["bloom_memory_usage_per_seen"] = bloom["seen_memory_usage"] / bloom["seen_count"]
    return out


def crawl(
    redis_url: str, redis_proc: Any, dsn: str, site: ProductSite, backend: str, pages: int, capacity: int
) -> dict:
    """One crawl node on the frontier at *redis_url*, to *pages* pages."""
    from page_states import _crawl_env, node_start
    from procs import cpu_seconds

    cmd = [sys.executable, "-m", "scrapy", "crawl", SPIDER, "-s", f"CLOSESPIDER_PAGECOUNT={pages}"]
    cmd += ["-s", f"DUPEFILTER_BACKEND={backend}", "-s", f"DUPEFILTER_BLOOM_CAPACITY={capacity}"]
    env = _crawl_env(redis_url, dsn, site, ROOT)  # type: ignore[arg-type]
    env["SCHEDULER_SECRET"] = SECRET
    redis_cpu = cpu_seconds(redis_proc.pid) or 0.0
    # A watch that does nothing keeps node_start polling the node's peak RSS until it exits.
    found = node_start(cmd, env, ROOT, site, watch=lambda: None)  # type: ignore[arg-type]
    redis_cpu = (cpu_seconds(redis_proc.pid) or 0.0) - redis_cpu
    products = site.product_arrivals()
    items = re.search(r"'item_scraped_count': (\d+)", found.pop("stderr"))
    found.update(
        products=len(products),
        items=int(items.group(1)) if items else 0,
        pages_per_s=(len(products) - 1) / (products[-1] - products[0]) if len(products) > 1 else 0.0,
        redis_cpu_ms_per_page=1000 * redis_cpu / max(1, len(products)),
    )
    return found


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("first_request_s", "cpu_at_first_request_s", "hwm_bytes", "pages_per_s", "redis_cpu_ms_per_page")
    return {key: statistics.median(r[key] for r in runs) for key in keys}


# ---- the run ---------------------------------------------------------------------------------


def measure(
    dsn_base: str, sizes: list[int], pages: int = 1000, repeat: int = 3, workers: int = 2, database: str = DATABASE
) -> dict[str, Any]:
    """Each size in turn: both frontiers grown to it, their memory read, then *repeat* crawls of
    *pages* pages on each (each backend first in turn), medians kept."""
    import redis
    from procs import private_redis
    from scratch import drop_database, scratch_database

    capacity = max(sizes)
    started = [private_redis() for _ in BACKENDS]
    if any(s is None for s in started):
        raise SystemExit("frontier_scale bench: no redis-server on this machine")
    procs = {b: s[0] for b, s in zip(BACKENDS, started)}  # type: ignore[index]
    urls = {b: s[1] for b, s in zip(BACKENDS, started)}  # type: ignore[index]
    dsn = scratch_database(dsn_base, database)
    rows: list[dict[str, Any]] = []
    try:
        servers = {b: redis.Redis.from_url(u) for b, u in urls.items()}
        bases = {b: _used(s) for b, s in servers.items()}
        with ProductSite() as site:
            bloom_keys = _open_bloom(urls["bloom"], capacity)
            bases["bloom"] = _used(servers["bloom"])  # the filter, allocated whole, is its base
            known = 0
            for size in sizes:
                seconds = fill(urls, site.origin, known, size, capacity, workers)
                row = {
                    "size": size,
                    "added": size - known,
                    "fill_s": seconds,
                    "memory": memory(servers, bases, size, bloom_keys),
                }
                known = size
                _print_memory(row)
                if known == sizes[0]:
                    for backend in BACKENDS:  # tables made and code warm before anything is timed
                        crawl(urls[backend], procs[backend], dsn, site, backend, 20, capacity)
                row["nodes"] = _crawls(urls, procs, dsn, site, pages, repeat, capacity)
                _print_nodes(size, row["nodes"])
                rows.append(row)
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait()
        drop_database(dsn_base, database)
    return {"pages_per_crawl": pages, "repeat": repeat, "workers": workers, "capacity": capacity, "rows": rows}


def _open_bloom(url: str, capacity: int) -> list[str]:
    """Open the crawl's Bloom filter (allocated whole) and return the keys of its slices."""
    from scrapy.settings import Settings

    from scraper.backends.redis_client import get_redis
    from scraper.queue.dupefilter import make_stores

    settings = Settings({"DUPEFILTER_BACKEND": "bloom", "DUPEFILTER_BLOOM_CAPACITY": capacity})
    store = make_stores(get_redis(url), SPIDER, settings)[0]
    store.generation()  # opens it, in the shape stored
    return store.bloom.slice_keys(store.base)


def _crawls(
    urls: dict[str, str], procs: dict[str, Any], dsn: str, site: ProductSite, pages: int, repeat: int, capacity: int
) -> dict:
    runs: dict[str, list[dict[str, Any]]] = {b: [] for b in BACKENDS}
    for turn in range(repeat):
        order = BACKENDS[turn % 2 :] + BACKENDS[: turn % 2]  # each first in turn: the machine drifts
        for backend in order:
            runs[backend].append(crawl(urls[backend], procs[backend], dsn, site, backend, pages, capacity))
    return {b: {**_medians(r), "runs": r} for b, r in runs.items()}


def _print_memory(row: dict[str, Any]) -> None:
    m = row["memory"]
    print(
        f"{row['size']:>12,} URLs queued ({row['added']:,} added in {row['fill_s']:.0f} s, "
        f"{row['added'] / row['fill_s']:,.0f} URLs/s into both frontiers): per queued request {m['used_memory_per_request']:.1f} B used_memory, "
        f"{m['memory_usage_per_request']:.1f} B MEMORY USAGE ({m['bloom']['encoding']}); per seen URL, set "
        f"{m['set_used_memory_per_seen']:.1f} / {m['set_memory_usage_per_seen']:.1f} B, "
        f"bloom {m['bloom_memory_usage_per_seen']:.2f} B",
        flush=True,
    )


def _print_nodes(size: int, nodes: dict[str, Any]) -> None:
    for backend, n in nodes.items():
        print(
            f"{'':>12} node, {backend:<5}: first request {n['first_request_s']:.2f} s "
            f"({n['cpu_at_first_request_s']:.2f} s CPU), peak RSS {n['hwm_bytes'] / 2**20:.1f} MB, "
            f"{n['pages_per_s']:.0f} pages/s, Redis {n['redis_cpu_ms_per_page']:.3f} CPU ms/page",
            flush=True,
        )


def table(result: dict[str, Any]) -> str:
    """The figures as two markdown tables: memory, then the node."""
    lines = [
        "| queued URLs | fill (URLs/s) | per queued request: used_memory / MEMORY USAGE | per seen URL, set: "
        "used_memory / MEMORY USAGE | per seen URL, Bloom (filter for "
        f"{result['capacity']:,}) |",
        "|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        m = row["memory"]
        lines.append(
            f"| {row['size']:,} | {row['fill_s']:.0f} s ({row['added'] / row['fill_s']:,.0f}) "
            f"| {m['used_memory_per_request']:.1f} / {m['memory_usage_per_request']:.1f} B "
            f"| {m['set_used_memory_per_seen']:.1f} / {m['set_memory_usage_per_seen']:.1f} B "
            f"| {m['bloom_memory_usage_per_seen']:.2f} B |"
        )
    lines += [
        "",
        f"| queued URLs | seen-set | first request (CPU) | peak RSS | pages/s ({result['pages_per_crawl']:,} pages) "
        "| Redis CPU per page |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        for backend, n in row["nodes"].items():
            lines.append(
                f"| {row['size']:,} | {backend} | {n['first_request_s']:.2f} s ({n['cpu_at_first_request_s']:.2f} s) "
                f"| {n['hwm_bytes'] / 2**20:.1f} MB | {n['pages_per_s']:.0f} | {n['redis_cpu_ms_per_page']:.3f} ms |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,1000000,10000000", help="URLs queued, comma-separated, ascending")
    parser.add_argument("--pages", type=int, default=1000, help="pages each crawl node fetches")
    parser.add_argument("--repeat", type=int, default=3, help="crawls on each frontier at each size (medians)")
    parser.add_argument("--workers", type=int, default=2, help="processes filling the frontiers")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    opts = parser.parse_args()
    dsn = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"
    sizes = [int(s) for s in opts.sizes.split(",")]
    if sizes != sorted(sizes):
        parser.error("--sizes must be ascending: each size grows the frontier of the one before")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()
    result = measure(dsn, sizes, opts.pages, opts.repeat, opts.workers)
    result.update(at=started, load_average_at_start=load, load_average_at_end=os.getloadavg())
    print("\n" + table(result))
    if opts.json:
        opts.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
