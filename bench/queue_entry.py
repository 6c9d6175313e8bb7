"""A queue entry's cost: Redis bytes per queued request and client CPU per push and pop.

``python bench/queue_entry.py [--base DIR]``: this checkout and, with ``--base``, another one
(say a clone of the commit before a format change), measured in one run on the same servers:
a private redis-server and a local 3-master cluster (``bench/cluster.py``'s, without replicas).
Each checkout runs in a process of its own (two versions of ``scraper`` cannot share one), and
the CPU rounds of the two alternate, so that another load on the machine weighs on both alike.

Two requests, each with a 70-character product URL and the demo spider's ``parse_product``:

* ``plain``: nothing else (a seed, or a link followed without a Referer);
* ``crawl``: as a crawl queues it, with its listing page as ``Referer`` and its ``depth``;

and, for memory only, ``demo``: ``bench/cluster.py``'s demo-shop request (a 40-odd-character
product URL on the local demo shop, its listing page as ``Referer``, its depth), the request of
the capacity table in ``docs/performance.md``.

Memory: ``--count`` distinct requests queued through the queue's own staging and flush (20 per
pipeline, as a listing page yields them); per request, the change of ``used_memory`` summed
over the masters and the queue key's ``MEMORY USAGE``. CPU (process time of the client, best of
``--rounds``): the entry alone (``_encode_request``, ``_decode_request``: JSON, signature,
request rebuilt) and through Redis (stage and flush; ``pop`` with the scheduler's prefetch, by
another queue object than the one that queued, so that every entry is read back from Redis).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
URL_LENGTH = 70
PER_PAGE = 20
PREFETCH = 4
SECRET = "bench-queue-entry-secret-0123456789abcdef"


def product_url(i: int) -> str:
    """The *i*-th product URL of the bench, 70 characters (distinct for i < 10**7)."""
    head = f"http://shop.example.com/c/kitchen-dining/p/{i:07d}-"
    return head + "x" * (URL_LENGTH - len(head) - len(".html")) + ".html"


def listing_url(i: int) -> str:
    return f"http://shop.example.com/c/kitchen-dining/?page={i // PER_PAGE + 1}"


# ---- in the child process: one checkout's code ----


SLUGS = ("audio", "kitchen-dining", "lighting", "apparel", "baby", "travel", "outdoor-garden", "home-office")


def _requests(spider: Any, kind: str, count: int, offset: int = 0) -> list[Any]:
    import scrapy

    out = []
    for i in range(offset, offset + count):
        if kind == "demo":  # bench/cluster.py's demo_requests, without their fingerprints
            slug, page = SLUGS[i % len(SLUGS)], i // (PER_PAGE * len(SLUGS)) + 1
            site = "http://127.0.0.1:8765/memory"
            out.append(
                scrapy.Request(
                    f"{site}/c/{slug}/p/{i + 1}.html",
                    callback=spider.parse_product,
                    headers={"Referer": f"{site}/c/{slug}/?page={page}"},
                    meta={"depth": page + 1},
                )
            )
            continue
        url = product_url(i)
        assert len(url) == URL_LENGTH
        if kind == "plain":
            out.append(scrapy.Request(url, callback=spider.parse_product))
        else:
            out.append(
                scrapy.Request(
                    url,
                    callback=spider.parse_product,
                    headers={"Referer": listing_url(i)},
                    meta={"depth": i // PER_PAGE + 2},
                )
            )
    return out


def _queue(server: Any, name: str) -> Any:
    from scraper.queue.queues import PriorityQueue
    from scraper.spiders.demo import DemoSpider

    return PriorityQueue(server, DemoSpider(), "{" + name + "}:requests", prefetch=PREFETCH)


def _stage_all(queue: Any, requests: list[Any]) -> None:
    for start in range(0, len(requests), PER_PAGE):
        for request in requests[start : start + PER_PAGE]:
            queue.stage(request)
        queue.flush_staged()


def _memory(url: str, masters: list[str], count: int) -> dict[str, Any]:
    import redis

    from scraper.backends.redis_client import get_redis

    server = get_redis(url)
    nodes = [redis.Redis.from_url(m) for m in masters]
    out: dict[str, Any] = {}
    for kind in ("plain", "crawl", "demo"):
        for node in nodes:
            node.flushall()
        queue = _queue(server, "memory")
        requests = _requests(queue.spider, kind, count)
        before = sum(int(n.info("memory")["used_memory"]) for n in nodes)
        _stage_all(queue, requests)
        after = sum(int(n.info("memory")["used_memory"]) for n in nodes)
        lists = getattr(queue, "lists", None)  # None: a checkout of the sorted-set queue (--base)
        if lists is None:
            queued, sample = server.zcard(queue.key), server.zrange(queue.key, 0, 0)[0]
            usage, encoding = server.memory_usage(queue.key, samples=0) or 0, server.object("encoding", queue.key)
        else:
            from scraper.queue.lists import index_key, list_key

            first = server.zrange(index_key(queue.key), 0, 0)[0]
            queued, sample = int(lists.length(queue.key)), lists.peek(queue.key, 1)[1][0]
            usage, encoding = lists.memory_usage(queue.key), server.object("encoding", list_key(queue.key, first))
        if queued != count:
            raise SystemExit(f"{queued} of {count} requests queued")
        out[kind] = {
            "entry_bytes": sum(len(queue._encode_request(r)) for r in requests[:1000]) / min(count, 1000),
            "used_memory_per_request": (after - before) / count,
            "memory_usage_per_request": usage / count,
            "encoding": str(encoding),
            "sample": sample.decode("utf-8", "replace"),
            **(_as_list(server, nodes, queue.key) if lists is None else {}),
        }
        for node in nodes:
            node.flushall()
    return out


def _cpu(url: str, count: int, rounds: int) -> dict[str, Any]:
    from scraper.backends.redis_client import get_redis

    server = get_redis(url)
    out: dict[str, Any] = {}
    for kind in ("plain", "crawl"):
        best: dict[str, float] = {}
        for r in range(rounds):
            server.flushdb()
            writer, reader = _queue(server, "cpu"), _queue(server, "cpu")
            requests = _requests(writer.spider, kind, count, offset=r * count)
            t0 = time.process_time()
            entries = [writer._encode_request(request) for request in requests]
            t1 = time.process_time()
            for entry in entries:
                reader._decode_request(entry)
            t2 = time.process_time()
            _keep(best, "encode_us", t1 - t0, count)
            _keep(best, "decode_us", t2 - t1, count)
            writer._callback_names.clear()
            t0 = time.process_time()
            _stage_all(writer, requests)
            t1 = time.process_time()
            popped = 0
            while reader.pop() is not None:
                popped += 1
            t2 = time.process_time()
            if popped != count:
                raise SystemExit(f"{popped} of {count} requests popped")
            _keep(best, "push_us", t1 - t0, count)
            _keep(best, "pop_us", t2 - t1, count)
        out[kind] = best
    server.flushdb()
    return out


def _keep(best: dict[str, float], name: str, seconds: float, count: int) -> None:
    """The best round so far, in µs per request."""
    best[name] = min(best.get(name, float("inf")), 1e6 * seconds / count)


def child(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(args.tree).resolve()))
    from scraper.queue import signing

    # The bench's own secret: no settings, and the same entries for both checkouts.
    signing._current = signing.Signer(SECRET)
    if args.part == "memory":
        result = {name: _memory(url, masters.split(","), args.count) for name, url, masters in args.stores}
    else:
        result = _cpu(args.stores[0][1], args.count, args.rounds)
    print(json.dumps(result))


# ---- in the parent: servers, one child per checkout and part ----


def _run_child(tree: Path, part: str, stores: list[tuple[str, str, str]], count: int, rounds: int) -> Any:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--tree", str(tree), "--part", part]
    cmd += ["--count", str(count), "--rounds", str(rounds)]
    for name, url, masters in stores:
        cmd += ["--store", name, url, masters]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tree), timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{tree} {part}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _as_list(server: Any, nodes: list[Any], key: str) -> dict[str, float]:
    """The same entries in another layout: one Redis list (as one priority's list would hold
    them), to show what a queue that is not one sorted-set member per request would cost. A
    list packs its entries into listpack nodes, with no skiplist node, dict entry or bucket per
    entry; what it gives up (a score per entry, members unique, removal by value) is what the
    queue's scripts use today."""
    entries = server.zrange(key, 0, -1)
    for node in nodes:
        node.flushall()
    target = key + ":list"
    before = sum(int(n.info("memory")["used_memory"]) for n in nodes)
    for start in range(0, len(entries), 1000):
        server.rpush(target, *entries[start : start + 1000])
    after = sum(int(n.info("memory")["used_memory"]) for n in nodes)
    return {
        "list_used_memory_per_request": (after - before) / len(entries),
        "list_memory_usage_per_request": (server.memory_usage(target, samples=0) or 0) / len(entries),
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "bench"))
    from cluster import cluster_store, plain_store

    trees = {"this": ROOT}
    if args.base:
        trees = {"base": Path(args.base).resolve(), **trees}
    plain, proc = plain_store()
    stores = [plain]
    try:
        stores.append(cluster_store(0))
        spec = [
            (
                store.label,
                store.url,
                ",".join(f"redis://{name}/0" if store.cluster else store.url for name in store.masters),
            )
            for store in stores
        ]
        figures: dict[str, Any] = {name: {} for name in trees}
        for name, tree in trees.items():
            figures[name]["memory"] = _run_child(tree, "memory", spec, args.count, 1)
        for _ in range(args.repeat):
            for name, tree in trees.items():
                cpu = _run_child(tree, "cpu", spec[:1], args.cpu_count, args.rounds)
                for kind, values in cpu.items():
                    kept = figures[name].setdefault("cpu", {}).setdefault(kind, {})
                    for key, value in values.items():
                        kept[key] = min(kept.get(key, float("inf")), value)
    finally:
        for store in stores:
            if store.cluster is not None:
                store.cluster.stop()
        proc.terminate()
        proc.wait()
    _report(figures, [s[0] for s in spec])
    return figures


def _report(figures: dict[str, Any], stores: list[str]) -> None:
    for kind in ("plain", "crawl", "demo"):
        print(f"\n{kind} request" + (f", {URL_LENGTH}-character URL" if kind != "demo" else " (bench/cluster.py's)"))
        for name, got in figures.items():
            for store in stores:
                m = got["memory"][store][kind]
                print(
                    f"  {name:5} {store:17} entry {m['entry_bytes']:6.1f} B; per queued request: used_memory "
                    f"{m['used_memory_per_request']:6.1f} B, MEMORY USAGE {m['memory_usage_per_request']:6.1f} B "
                    f"({m['encoding']})"
                )
                if "list_used_memory_per_request" in m:
                    print(
                        f"  {name:5} {store:17} the same entries in one list: used_memory "
                        f"{m['list_used_memory_per_request']:6.1f} B, MEMORY USAGE {m['list_memory_usage_per_request']:6.1f} B"
                    )
            c = got["cpu"].get(kind)
            if c is None:
                continue
            print(
                f"  {name:5} client CPU per request, µs: encode {c['encode_us']:.1f}, decode {c['decode_us']:.1f}; "
                f"push (stage+flush) {c['push_us']:.1f}, pop {c['pop_us']:.1f}"
            )
        print("  sample entry: " + figures[list(figures)[-1]]["memory"][stores[0]][kind]["sample"])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="another checkout to measure beside this one (its own scraper/)")
    parser.add_argument("--count", type=int, default=20_000, help="requests queued to measure memory")
    parser.add_argument("--cpu-count", type=int, default=5_000, help="requests per CPU round")
    parser.add_argument("--rounds", type=int, default=3, help="CPU rounds per process (the best is kept)")
    parser.add_argument("--repeat", type=int, default=2, help="CPU processes per checkout, alternating")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--store", dest="stores", nargs=3, action="append", default=[], help=argparse.SUPPRESS)
    return parser


if __name__ == "__main__":
    options = _parser().parse_args()
    if options.child:
        child(options)
    else:
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        result = main(options)
        print(f"\nmeasured {started}")
        if options.json:
            Path(options.json).write_text(json.dumps({"at": started, **result}, indent=2))
