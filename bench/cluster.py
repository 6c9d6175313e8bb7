"""The shared frontier on one plain Redis vs a local 3-master Redis Cluster: memory and throughput.

``bench/run.py --only cluster``. Both are private redis-servers on this machine (the cluster
built by the tests' :class:`LocalCluster`, without replicas unless ``--cluster-replicas``), so
their CPU, read from /proc, is the bench's alone. On each:

* bytes per queued request, per seen URL (set and Bloom filter) and per lease: ``--cluster-memory``
  demo-shop requests (a product URL, its listing page as Referer, its depth) claimed and queued
  through the queue's own staging and flush (``push_if_new``, a pipeline per listing page), then
  all taken into leases with ``Leases.take``; memory is the change of ``used_memory`` summed over
  the masters, the seen-state's part its ``MEMORY USAGE``;
* claims/s (staging and flush, as above) and pops/s (the queue's ``pop`` with leases and the
  scheduler's default prefetch), each client a process of its own with its own spider, 1 and
  ``--cluster-clients`` clients at once, and the Redis CPU seconds per 1,000 of each.

Every key of a spider carries its hash tag, so one spider's frontier sits on one master: the
spiders of the parallel runs are named so that their tags land on different masters.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# Appended, not inserted: the tests' module names must not shadow the bench's own.
if str(ROOT / "tests") not in sys.path:
    sys.path.append(str(ROOT / "tests"))

import redis  # noqa: E402
from procs import cpu_seconds, private_redis, redis_pid  # noqa: E402
from redis.crc import key_slot  # noqa: E402

SLUGS = ("audio", "kitchen-dining", "lighting", "apparel", "baby", "travel", "outdoor-garden", "home-office")
PER_PAGE = 20  # products per listing page of the demo shop: the links one page yields at once
PREFETCH = 4  # SCHEDULER_PREFETCH's default
BARRIER_TIMEOUT = 120


def demo_requests(spider: Any, count: int, salt: str, hosts: int = 1) -> list[tuple[Any, str]]:
    """(request, fingerprint) as a crawl of the demo shop queues them: product pages found on
    listing pages, with the Referer and depth the spider middlewares add; with *hosts* > 1, as
    many shops (a listing page's links stay on its shop), for a frontier sharded by domain."""
    import scrapy
    from scrapy.utils.request import RequestFingerprinter

    fingerprinter = RequestFingerprinter()
    out = []
    for i in range(count):
        slug = SLUGS[i % len(SLUGS)]
        page = i // (PER_PAGE * len(SLUGS)) + 1
        site = f"http://127.0.0.1:8765/{salt}" if hosts == 1 else f"http://shop{(i // PER_PAGE) % hosts}.test/{salt}"
        request = scrapy.Request(
            f"{site}/c/{slug}/p/{i + 1}.html",
            callback=spider.parse_product,
            headers={"Referer": f"{site}/c/{slug}/?page={page}"},
            meta={"depth": page + 1},
        )
        out.append((request, fingerprinter.fingerprint(request).hex()))
    return out


def frontier(server: Any, name: str, shards: int = 1) -> tuple[Any, Any, Any]:
    """(queue, set seen-state, leases) of spider *name*, under its hash-tagged keys, its
    frontier in *shards* shards (``SCHEDULER_SHARDS``)."""
    from scraper.queue import keys
    from scraper.queue.dupefilter import SeenSet, SharedDupeFilter
    from scraper.queue.leases import Leases
    from scraper.queue.queues import PriorityQueue
    from scraper.queue.shards import Shards
    from scraper.spiders.demo import DemoSpider

    split = Shards(name, shards)
    queue = PriorityQueue(server, DemoSpider(), keys.queue_key(name), prefetch=PREFETCH, shards=split)
    stores = [SeenSet(server, split.seen_key(i, keys.dupefilter_key(name))) for i in range(shards)]
    seen = SharedDupeFilter(server, keys.dupefilter_key(name), None, stores=stores, shards=split)
    leases = Leases(server, name, keys.queue_key(name), keys.dead_key(name), ttl=3600, shards=split)
    return queue, seen, leases


def claim_all(queue: Any, seen: Any, requests: list[tuple[Any, str]]) -> int:
    queued = 0
    for start in range(0, len(requests), PER_PAGE):
        for request, fingerprint in requests[start : start + PER_PAGE]:
            queue.stage(request, seen, fingerprint)
        queued += queue.flush_staged()[0]
    return queued


def pop_all(queue: Any) -> int:
    popped = 0
    while queue.pop() is not None:
        popped += 1
    return popped


def _client(url: str, name: str, count: int, barrier: Any, answers: Any, shards: int = 1, salt: str = "") -> None:
    """One crawler's share of the frontier work, as its own process: claims, then pops, each
    between two barriers at which the parent reads the clock and the servers' CPU."""
    from scraper.backends.redis_client import get_redis

    server = get_redis(url)
    queue, seen, leases = frontier(server, name, shards)
    queue.leases = leases
    requests = demo_requests(queue.spider, count, salt or name, hosts=1 if shards == 1 else 30 * shards)
    barrier.wait(BARRIER_TIMEOUT)
    cpu0 = time.process_time()
    claimed = claim_all(queue, seen, requests)
    cpu1 = time.process_time()
    barrier.wait(BARRIER_TIMEOUT)
    popped = pop_all(queue)
    cpu2 = time.process_time()
    barrier.wait(BARRIER_TIMEOUT)
    answers.put((salt or name, claimed, popped, cpu1 - cpu0, cpu2 - cpu1))


class Store:
    """One plain Redis or one cluster: its client URL, its masters' clients, its server pids."""

    def __init__(self, label: str, url: str, masters: dict[str, Any], pids: dict[str, int], cluster: Any = None):
        self.label = label
        self.url = url
        self.masters = masters
        self.pids = pids
        self.cluster = cluster

    def client(self) -> Any:
        from scraper.backends.redis_client import get_redis

        return get_redis(self.url)

    def flush(self) -> None:
        for master in self.masters.values():
            master.flushall()

    def used_memory(self) -> int:
        return sum(int(m.info("memory")["used_memory"]) for m in self.masters.values())

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) or 0.0 for name, pid in self.pids.items()}

    def calls(self) -> dict[str, int]:
        """Commands the masters ran so far, by name, summed."""
        out: dict[str, int] = {}
        for master in self.masters.values():
            for name, stats in master.info("commandstats").items():
                out[name.removeprefix("cmdstat_")] = out.get(name.removeprefix("cmdstat_"), 0) + int(stats["calls"])
        return out

    def home(self, spider: str) -> str:
        """The node that holds *spider*'s keys."""
        if self.cluster is None:
            return self.label
        return f"127.0.0.1:{self.cluster.master_of('{' + spider + '}')}"


def plain_store() -> tuple[Store, Any]:
    own = private_redis()
    if own is None:
        raise SystemExit("the cluster part needs the redis-server binary")
    proc, url = own
    url = url.rsplit("/", 1)[0] + "/0"
    master = redis.Redis.from_url(url)
    return Store("one Redis", url, {"redis": master}, {"redis": redis_pid(master)}), proc


def cluster_store(replicas: int) -> Store:
    from support.redis_cluster import LocalCluster

    cluster = LocalCluster(masters=3, replicas=replicas)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()  # its nodes would otherwise outlive the bench
        raise
    masters = {f"127.0.0.1:{port}": cluster.node(port) for port in cluster.masters()}
    pids = {f"127.0.0.1:{port}": proc.pid for port, proc in cluster.procs.items()}
    return Store("3-master cluster", cluster.url, masters, pids, cluster)


def spread_names(count: int, masters: list[tuple[int, int]]) -> list[str]:
    """*count* spider names whose hash tags land on the masters in turn (by slot ranges)."""
    names: list[str] = []
    candidate = 0
    while len(names) < count:
        low, high = masters[len(names) % len(masters)]
        while True:
            name = f"spider{candidate}"
            candidate += 1
            if low <= key_slot(("{" + name + "}").encode()) <= high:
                names.append(name)
                break
    return names


def memory(store: Store, count: int) -> dict[str, float]:
    """Bytes per queued request, per seen URL (set, Bloom) and per leased request."""
    from scraper.queue import keys
    from scraper.queue.bloom import BloomFilter, BloomSeen

    store.flush()
    server = store.client()
    name = "memory"
    queue, seen, leases = frontier(server, name)
    requests = demo_requests(queue.spider, count, name)
    base = store.used_memory()
    claimed = claim_all(queue, seen, requests)
    if claimed != count:
        raise SystemExit(f"{store.label}: {claimed} of {count} requests queued")
    queued = store.used_memory()
    seen_bytes = server.memory_usage(keys.dupefilter_key(name), samples=0) or 0
    data_bytes = sum(len(queue._encode_request(r)) for r, _ in requests[:1000]) / 1000
    while leases.take(500):
        pass
    leased = store.used_memory()
    bloom = BloomSeen(server, keys.bloom_key(name), BloomFilter.for_capacity(count, 0.001))
    before_bloom = store.used_memory()
    if bloom.add_many([fp for _, fp in requests]) < count * 0.99:
        raise SystemExit(f"{store.label}: the Bloom filter took too many new URLs for seen")
    bloom_bytes = sum(server.memory_usage(k, samples=0) or 0 for k in bloom.keys())
    bloom_delta = store.used_memory() - before_bloom
    store.flush()
    return {
        "request_json": data_bytes,
        "queued": (queued - base - seen_bytes) / count,
        "seen_set": seen_bytes / count,
        "leased": (leased - base - seen_bytes) / count,
        "bloom": bloom_bytes / count,
        "bloom_delta": bloom_delta / count,
    }


def throughput(store: Store, names: list[str], count: int, shards: int = 1) -> dict[str, Any]:
    """Claims and pops of len(*names*) client processes at once, *count* requests each; with
    *shards* > 1, every client works on the one spider ``names[0]``, its frontier sharded."""
    store.flush()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(names) + 1)
    answers = ctx.Queue()
    procs = [
        ctx.Process(
            target=_client,
            args=(
                store.url,
                names[0] if shards > 1 else name,
                count,
                barrier,
                answers,
                shards,
                f"c{i}" if shards > 1 else "",
            ),
        )
        for i, name in enumerate(names)
    ]
    for proc in procs:
        proc.start()
    try:
        marks = []
        for _ in range(3):
            barrier.wait(BARRIER_TIMEOUT)
            marks.append((time.monotonic(), store.cpu(), store.calls()))
        results = [answers.get(timeout=BARRIER_TIMEOUT) for _ in names]
        for proc in procs:
            proc.join(BARRIER_TIMEOUT)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    total = count * len(names)
    client_cpu = {"claims": sum(r[3] for r in results), "pops": sum(r[4] for r in results)}
    if shards > 1:  # one spider: every client pops from the shared frontier, whoever queued it
        claimed, popped = sum(r[1] for r in results), sum(r[2] for r in results)
        if claimed != total or popped != total:
            raise SystemExit(f"{store.label}: {claimed} claimed and {popped} popped of {total}")
    for name, claimed, popped, _, _ in results if shards == 1 else ():
        if claimed != count or popped != count:
            raise SystemExit(f"{store.label}: {name} claimed {claimed} and popped {popped} of {count}")
    out: dict[str, Any] = {
        "clients": len(names),
        "shards": shards,
        "homes": ({n: store.home(n) for n in names} if shards == 1 else _shard_homes(store, names[0], shards)),
    }
    for phase, (start, end) in (("claims", (marks[0], marks[1])), ("pops", (marks[1], marks[2]))):
        seconds = end[0] - start[0]
        used = {node: end[1][node] - start[1][node] for node in end[1]}
        # Which commands an operation costs the server: a round trip more shows here.
        commands = {name: (calls - start[2].get(name, 0)) / total for name, calls in end[2].items()}
        out[phase] = {
            "per_s": total / seconds,
            "seconds": seconds,
            "redis_cpu_per_1000": 1000 * sum(used.values()) / total,
            "client_cpu_per_1000": 1000 * client_cpu[phase] / total,
            "busiest_master_cpu_share": max(used.values()) / seconds,
            "cpu_by_node": used,
            "commands_per_op": {k: round(v, 2) for k, v in commands.items() if v >= 0.05},
        }
    store.flush()
    return out


def run(
    res: Any, memory_count: int = 60_000, ops_count: int = 20_000, clients: int = 3, replicas: int = 0
) -> dict[str, Any]:
    print(
        f"\none Redis vs a local 3-master Redis Cluster ({replicas} replicas per master): memory for "
        f"{memory_count:,} demo requests, claims and pops of {ops_count:,} requests per client, 1 and "
        f"{clients} client processes ...",
        flush=True,
    )
    cmp = "Redis Cluster capacity"
    figures: dict[str, Any] = {}
    plain, plain_proc = plain_store()
    stores = [plain]
    try:
        stores.append(cluster_store(replicas))
        cluster = stores[1].cluster
        names = spread_names(max(1, clients), _slot_ranges(cluster))
        for store in stores:
            mem = memory(store, memory_count)
            print(
                f"{store.label}: {mem['request_json']:.0f}-byte request JSON; queued {mem['queued']:.0f} bytes per "
                f"request, seen-set {mem['seen_set']:.1f} bytes per URL, Bloom filter (0.1 %) {mem['bloom']:.2f}, "
                f"leased {mem['leased']:.0f} bytes per request",
                flush=True,
            )
            tag = {"store": store.label, "requests": memory_count}
            res.add(
                cmp, "bytes per queued request", mem["queued"], "bytes", request_json=round(mem["request_json"]), **tag
            )
            res.add(cmp, "bytes per seen URL, set", mem["seen_set"], "bytes", **tag)
            res.add(cmp, "bytes per seen URL, Bloom filter at 0.1 %", mem["bloom"], "bytes", **tag)
            res.add(cmp, "bytes per leased request", mem["leased"], "bytes", **tag)
            runs = []
            for group in ([names[0]], names) if clients > 1 else ([names[0]],):
                r = throughput(store, group, ops_count)
                runs.append(r)
                homes = ", ".join(f"{n} on {h}" for n, h in r["homes"].items())
                print(f"  {r['clients']} client(s) ({homes}):", flush=True)
                for phase in ("claims", "pops"):
                    p = r[phase]
                    print(
                        f"    {phase:6} {p['per_s']:>8,.0f}/s, CPU s per 1,000: Redis {p['redis_cpu_per_1000']:.3f}, "
                        f"clients {p['client_cpu_per_1000']:.3f}; busiest Redis process "
                        f"{100 * p['busiest_master_cpu_share']:.0f} % of a core; commands per {phase[:-1]}: "
                        + ", ".join(f"{k} {v:g}" for k, v in sorted(p["commands_per_op"].items())),
                        flush=True,
                    )
                    detail = {
                        "store": store.label,
                        "clients": r["clients"],
                        "homes": r["homes"],
                        "requests_per_client": ops_count,
                    }
                    res.add(cmp, f"{phase}/s", p["per_s"], f"{phase}/s", **detail)
                    res.add(
                        cmp,
                        f"Redis CPU per 1,000 {phase}",
                        p["redis_cpu_per_1000"],
                        "s",
                        cpu_by_node={k: round(v, 2) for k, v in p["cpu_by_node"].items()},
                        commands_per_op=p["commands_per_op"],
                        **detail,
                    )
                    res.add(cmp, f"client CPU per 1,000 {phase}", p["client_cpu_per_1000"], "s", **detail)
            if store.cluster is not None and clients > 1:
                # One spider, its frontier in one shard per master: the spread several spiders get.
                r = throughput(store, [names[0]] * clients, ops_count, shards=len(names))
                runs.append(r)
                print(
                    f"  {r['clients']} client(s) of one spider, SCHEDULER_SHARDS={len(names)} "
                    f"({', '.join(f'{t} on {h}' for t, h in r['homes'].items())}):",
                    flush=True,
                )
                for phase in ("claims", "pops"):
                    p = r[phase]
                    print(
                        f"    {phase:6} {p['per_s']:>8,.0f}/s, CPU s per 1,000: Redis {p['redis_cpu_per_1000']:.3f}, "
                        f"clients {p['client_cpu_per_1000']:.3f}; busiest Redis process "
                        f"{100 * p['busiest_master_cpu_share']:.0f} % of a core",
                        flush=True,
                    )
                    detail = {
                        "store": store.label,
                        "clients": r["clients"],
                        "shards": len(names),
                        "homes": r["homes"],
                        "requests_per_client": ops_count,
                    }
                    res.add(cmp, f"{phase}/s, one spider sharded", p["per_s"], f"{phase}/s", **detail)
                    res.add(
                        cmp,
                        f"Redis CPU per 1,000 {phase}, one spider sharded",
                        p["redis_cpu_per_1000"],
                        "s",
                        cpu_by_node={k: round(v, 2) for k, v in p["cpu_by_node"].items()},
                        **detail,
                    )
            figures[store.label] = {"memory": mem, "runs": runs}
        for phase in ("claims", "pops"):
            single = figures[stores[1].label]["runs"][0][phase]["redis_cpu_per_1000"]
            ceiling = 1000 / single if single else float("inf")
            res.add(
                cmp,
                f"one master's ceiling, {phase}/s (one core / measured Redis CPU per {phase[:-1]})",
                ceiling,
                f"{phase}/s",
                store=stores[1].label,
            )
            print(
                f"one master's ceiling from its CPU per {phase[:-1]}: ~{ceiling:,.0f} {phase}/s with a core of its own",
                flush=True,
            )
        print(
            "Every key of a spider carries its hash tag {spider}: unsharded, one spider's frontier sits in one "
            "slot on one master, so its claims and pops are bounded by that master's core; with "
            "SCHEDULER_SHARDS=N its frontier spreads over N hash tags, so over up to N masters.",
            flush=True,
        )
    finally:
        for store in stores:
            if store.cluster is not None:
                store.cluster.stop()
        plain_proc.terminate()
        plain_proc.wait()
    return figures


def _shard_homes(store: Store, name: str, shards: int) -> dict[str, str]:
    from scraper.queue.shards import Shards

    return {tag: store.home(tag.strip("{}")) for tag in Shards(name, shards).prefixes}


def _slot_ranges(cluster: Any) -> list[tuple[int, int]]:
    """The first slot range of each master, in port order."""
    node = cluster.node(cluster.masters()[0])
    ranges: dict[int, tuple[int, int]] = {}
    for start, end, (_host, port, *_), *_ in node.execute_command("CLUSTER", "SLOTS"):
        ranges.setdefault(int(port), (int(start), int(end)))
    return [ranges[port] for port in sorted(ranges)]
