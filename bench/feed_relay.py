"""The change feed's relay: events/s published with confirms, per sink, and commit-to-publish
latency under a steady writer.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test .venv/bin/python bench/feed_relay.py [--events N]

Works in a database of its own (``bench_feed``, made and dropped on the server of
DATABASE_URL), on RabbitMQ (``RABBITMQ_URL``, default the local one) and NATS (``NATS_URL``), in
a stream of its own (deleted at the end). Throughput: N history rows committed first, then one
relay run ``--once`` per sink (the batch size is ``CHANGEFEED_BATCH``'s default); events/s is
N over the run's wall time, CPU the relay process's own. Latency: a writer commits one change
every 5 ms for 10 s while a relay follows; a NATS subscriber notes when each event arrives;
latency is arrival minus the writer's commit time. Lake (``--lake``): one append of N rows to
the Iceberg ``changes`` table in a folder (the commit's wall time: Parquet file, manifests,
metadata, the catalog row), and a relay run ``--once`` to the lake in batches of 5,000.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import nats
import pika
import psycopg2
from scrapy.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scratch import drop_database, scratch_database  # noqa: E402

from scraper.feed import config as feed_config  # noqa: E402
from scraper.feed import sinks  # noqa: E402
from scraper.feed.relay import Relay  # noqa: E402
from scraper.storage import history  # noqa: E402

RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("NATS_URL", "nats://127.0.0.1:4222")


def fill(dsn: str, n: int) -> None:
    conn = psycopg2.connect(dsn)
    with conn, conn.cursor() as cur:
        history.ensure(cur)
    for start in range(0, n, 1000):
        with conn, conn.cursor() as cur:
            changes = [
                history.Change(["demo", f"SKU-{i:07d}"], "update", {"price": [1.0, 2.0], "title": ["a", "b"]})
                for i in range(start, min(start + 1000, n))
            ]
            history.record(cur, "products", changes, history.Context("demo", 1))
    conn.close()


def conf_for(name: str) -> feed_config.FeedConfig:
    return feed_config.read(
        Settings(
            {
                "CHANGEFEED_RABBITMQ_URL": RABBITMQ_URL,
                "CHANGEFEED_RABBITMQ_STREAM": name,
                "CHANGEFEED_NATS_URL": NATS_URL,
                "CHANGEFEED_NATS_STREAM": name.upper(),
                "CHANGEFEED_NATS_SUBJECT": name,
                "CHANGEFEED_POLL_INTERVAL": "0.05",
            }
        )
    )


def throughput(dsn: str, kind: str, conf: feed_config.FeedConfig, n: int) -> dict[str, float]:
    relay = Relay(dsn, sinks.make(kind, conf), conf, name=f"bench-{kind}", say=lambda _t: None)
    cpu, wall = time.process_time(), time.perf_counter()
    progress = asyncio.run(relay.run(follow=False))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert progress.published == n, (kind, progress.published)
    return {"events_per_s": n / wall, "cpu_s_per_1000": cpu / n * 1000, "wall_s": wall}


def latency(dsn: str, conf: feed_config.FeedConfig, seconds: float = 10.0) -> dict[str, float]:
    committed: dict[int, float] = {}
    arrived: dict[int, float] = {}
    # The throughput run's position: everything before is published already.
    relay = Relay(dsn, sinks.make("nats", conf), conf, name="bench-nats", say=lambda _t: None)
    stop = threading.Event()

    def writer() -> None:
        conn = psycopg2.connect(dsn)
        i = 0
        while not stop.is_set():
            with conn, conn.cursor() as cur:
                history.record(cur, "products", [history.Change(["demo", f"L{i}"], "update", {})], history.Context())
                cur.execute("SELECT currval('item_changes_id_seq')")
                event_id = cur.fetchone()[0]
            committed[event_id] = time.time()
            i += 1
            time.sleep(0.005)
        conn.close()

    async def main() -> None:
        nc = await nats.connect(NATS_URL)

        async def got(msg) -> None:  # type: ignore[no-untyped-def]
            arrived[int(msg.headers["Nats-Msg-Id"])] = time.time()

        await nc.subscribe(f"{conf.nats_subject}.>", cb=got)
        task = asyncio.ensure_future(relay.run(follow=True))
        thread = threading.Thread(target=writer)
        thread.start()
        await asyncio.sleep(seconds)
        stop.set()
        thread.join()
        await asyncio.sleep(1.0)
        relay.stop()
        await task
        await nc.close()

    asyncio.run(main())
    lags = sorted(arrived[i] - committed[i] for i in committed if i in arrived)
    assert len(lags) == len(committed), (len(lags), len(committed))
    return {
        "events": len(lags),
        "p50_s": statistics.median(lags),
        "p95_s": lags[int(len(lags) * 0.95) - 1],
        "max_s": lags[-1],
    }


def lake(dsn: str, n: int) -> dict[str, float]:
    import tempfile

    import pyarrow as pa

    from scraper.feed.sinks.lake import _CHANGES_ARROW, LakeSink, key_text

    # The items the events name, so that the relay upserts `current` as it would for a crawl.
    conn = psycopg2.connect(dsn)
    with conn, conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE IF NOT EXISTS products (spider text, sku text, title text, price numeric,"
            " content_hash text, gone_at timestamptz, PRIMARY KEY (spider, sku))"
        )
        cur.execute(
            "INSERT INTO products SELECT 'demo', 'SKU-' || lpad(i::text, 7, '0'), 'b', 2.0, md5(i::text), NULL"
            " FROM generate_series(0, %s) i ON CONFLICT DO NOTHING",
            (n,),
        )
    conn.close()
    folder = tempfile.mkdtemp(prefix="bench-lake-")
    sink = LakeSink(dsn, folder, namespace="bench_lake")
    asyncio.run(sink.open())
    now = datetime.now(UTC)
    rows = pa.Table.from_pylist(
        [
            {
                "id": i,
                "item_table": "products",
                "key": key_text(["demo", f"SKU-{i:07d}"]),
                "kind": "update",
                "reason": "crawl",
                "spider": "demo",
                "run_id": 1,
                "at": now,
                "changes": '{"price":[1.0,2.0]}',
            }
            for i in range(n)
        ],
        schema=_CHANGES_ARROW,
    )
    started = time.perf_counter()
    sink._changes.append(rows)
    append = time.perf_counter() - started
    asyncio.run(sink.close())
    conf = feed_config.read(Settings({"CHANGEFEED_LAKE_FOLDER": folder, "CHANGEFEED_BATCH": "5000"}))
    relay = Relay(dsn, sinks.make("lake", conf, dsn), conf, name="bench-lake", say=lambda _t: None)
    cpu, wall = time.process_time(), time.perf_counter()
    progress = asyncio.run(relay.run(follow=False))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "append_rows": n,
        "append_commit_s": append,
        "relay_events": progress.published,
        "relay_events_per_s": progress.published / wall,
        "relay_cpu_s_per_1000": cpu / max(progress.published, 1) * 1000,
    }


def cleanup(name: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    connection.channel().queue_delete(name)
    connection.close()

    async def drop() -> None:
        nc = await nats.connect(NATS_URL)
        await nc.jetstream().delete_stream(name.upper())
        await nc.close()

    asyncio.run(drop())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--lake", action="store_true", help="the lake only: a 100,000-row append and a relay run")
    args = parser.parse_args()
    base = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/test"
    dsn = scratch_database(base, "bench_feed")
    name = f"bench_feed_{uuid.uuid4().hex[:8]}"
    conf = conf_for(name)
    results: dict[str, object] = {"events": args.events}
    if args.lake:
        try:
            fill(dsn, args.events)
            results["lake"] = lake(dsn, 100_000)
        finally:
            drop_database(base, "bench_feed")
        print(json.dumps(results, indent=2))
        return
    try:
        fill(dsn, args.events)
        for kind in ("rabbitmq", "nats"):
            results[kind] = throughput(dsn, kind, conf, args.events)
        results["commit_to_publish_nats"] = latency(dsn, conf)
    finally:
        cleanup(name)
        drop_database(base, "bench_feed")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
