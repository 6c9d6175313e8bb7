"""The change feed: item_changes read by transaction visibility (nothing skipped when
transactions commit out of id order, per-key commit order kept), the sinks against the real
RabbitMQ, NATS JetStream and a webhook server of the test's own, the commands, and the relay
killed at random points while a writer commits."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import multiprocessing
import os
import random
import signal
import socket
import threading
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import nats
import pika
import psycopg2
import pytest
from scrapy.settings import Settings
from support.crawls import crawl_env, run_scrapy
from support.storage_items import COLUMNS as GADGET_COLUMNS
from support.storage_items import Gadget, GadgetHistory
from support.storage_items import row as gadget_row

from scraper.config import ConfigError
from scraper.feed import config as feed_config
from scraper.feed import events, position, verify
from scraper.feed import sinks as feed_sinks
from scraper.feed.metrics import FeedMetrics
from scraper.feed.relay import Relay
from scraper.feed.sinks.base import SinkFatal
from scraper.feed.sinks.nats import NatsSink
from scraper.feed.sinks.rabbitmq import RabbitMQSink
from scraper.feed.sinks.webhook import WebhookSink, signature
from scraper.storage import history, schema
from scraper.storage.upsert import TableUpserter


@pytest.fixture
def db(clean):
    conn = psycopg2.connect(clean.database_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        history.ensure(cur)
        position.ensure(cur)
        cur.execute("CREATE TABLE feed_items (k text PRIMARY KEY, seq int NOT NULL DEFAULT 0)")
    yield clean
    conn.close()


def _connect(services):
    conn = psycopg2.connect(services.database_url)
    return conn


def _change(cur, key: str, note: str = "") -> int:
    """One history row for *key*, written as the upsert does: after locking the item's row.
    Returns the item's change number (1, 2, ... in the order the changes of that item commit)."""
    cur.execute(
        "INSERT INTO feed_items AS f (k, seq) VALUES (%s, 1) ON CONFLICT (k) DO UPDATE SET seq = f.seq + 1"
        " RETURNING seq",
        (key,),
    )
    seq = cur.fetchone()[0]
    history.record(
        cur,
        "feed_items",
        [history.Change([key], "update", {"seq": [seq - 1, seq], "note": [None, note]})],
        history.Context("t", 1),
    )
    return seq


def _read_all(conn, sink: str, limit: int = 1000) -> list:
    reader = position.Reader(conn, sink)
    out = []
    while True:
        events = reader.read(limit)
        if not events:
            return out
        out.extend(events)
        reader.advance(events)


def test_a_row_committed_late_is_not_skipped(db) -> None:
    early, late, relay = _connect(db), _connect(db), _connect(db)
    relay.autocommit = True
    with early.cursor() as cur:
        _change(cur, "a")  # takes the lower id, commits last
    with late, late.cursor() as cur:
        _change(cur, "b")
    first = _read_all(relay, "s")
    assert [e.key for e in first] == [["b"]]
    early.commit()
    second = _read_all(relay, "s")
    assert [e.key for e in second] == [["a"]] and second[0].id < first[0].id
    assert _read_all(relay, "s") == []
    for c in (early, late, relay):
        c.close()


def test_commit_order_per_key_beats_transaction_start_order(db) -> None:
    """T1 starts before T2, T2 changes k and commits, then T1 changes k and commits, while an
    older T3 still runs: T2's change of k must go out before T1's, whatever T3 does."""
    t1, t2, t3, relay = (_connect(db) for _ in range(4))
    relay.autocommit = True
    with t1.cursor() as cur:
        cur.execute("SELECT pg_current_xact_id()")  # T1's xid comes first
    with t3.cursor() as cur:
        cur.execute("SELECT pg_current_xact_id()")
    with t2, t2.cursor() as cur:
        _change(cur, "k", "t2")
    with t1, t1.cursor() as cur:
        _change(cur, "k", "t1")
    out = _read_all(relay, "s")
    assert [e.changes["note"][1] for e in out] == ["t2", "t1"]
    with t3, t3.cursor() as cur:
        _change(cur, "k", "t3")
    assert [e.changes["note"][1] for e in _read_all(relay, "s")] == ["t3"]
    for c in (t1, t2, t3, relay):
        c.close()


def test_concurrent_writers_committing_out_of_order_lose_nothing(db) -> None:
    """Six writers commit after random delays (so out of id order), a reader reads all along and
    is restarted from its saved position at random: every row once, each key in commit order."""
    stop = time.monotonic() + 4
    keys = [f"k{i}" for i in range(12)]
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        conn = _connect(db)
        try:
            while time.monotonic() < stop:
                with conn, conn.cursor() as cur:
                    if rng.random() < 0.5:  # an xid taken early, the key locked late
                        cur.execute("SELECT pg_current_xact_id()")
                        time.sleep(rng.random() * 0.02)
                    for key in sorted(rng.sample(keys, rng.randint(1, 3))):
                        _change(cur, key)
                    time.sleep(rng.random() * 0.03)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    seen: list = []
    relay = _connect(db)
    relay.autocommit = True
    reader = position.Reader(relay, "s")
    rng = random.Random(99)
    while any(t.is_alive() for t in threads):
        events = reader.read(rng.randint(1, 20))
        if events:
            seen.extend(events)
            if rng.random() < 0.8:
                reader.advance(events)
            # else: "dies" before saving: the next reader publishes them again
        if rng.random() < 0.2:
            reader = position.Reader(relay, "s")
        time.sleep(rng.random() * 0.01)
    for t in threads:
        t.join()
    assert not errors, errors
    seen.extend(_read_all(relay, "s"))
    first: dict[int, object] = {}
    for event in seen:
        first.setdefault(event.id, event)
    with relay.cursor() as cur:
        cur.execute("SELECT id FROM item_changes ORDER BY id")
        ids = [r[0] for r in cur.fetchall()]
    assert len(ids) > 100
    assert sorted(first) == ids, "events lost or invented"
    per_key: dict[str, list[int]] = {}
    for event in first.values():
        per_key.setdefault(event.key[0], []).append(event.changes["seq"][1])
    for key, seqs in per_key.items():
        assert seqs == list(range(1, len(seqs) + 1)), f"{key}: changes out of commit order: {seqs}"
    with relay.cursor() as cur:
        cur.execute("SELECT published FROM change_feed_positions WHERE sink = 's'")
        assert cur.fetchone()[0] == len(ids)
        condition, params = position.behind_condition(position.load(cur, "s"))
        cur.execute(f"SELECT count(*) FROM item_changes WHERE {condition}", params)
        assert cur.fetchone()[0] == len(ids)
    relay.close()


def test_rows_from_before_the_column_are_published_first(db) -> None:
    conn = _connect(db)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("ALTER TABLE item_changes ALTER COLUMN xid DROP DEFAULT")
        _change(cur, "old")
        cur.execute("ALTER TABLE item_changes ALTER COLUMN xid SET DEFAULT pg_current_xact_id()")
        _change(cur, "new")
    assert [e.key for e in _read_all(conn, "s")] == [["old"], ["new"]]
    with conn.cursor() as cur:
        _change(cur, "newer")
        assert [e.key for e in _read_all(conn, "s")] == [["newer"]]
        condition, params = position.behind_condition(position.load(cur, "s"))
        cur.execute(f"SELECT count(*) FROM item_changes WHERE {condition}", params)
        assert cur.fetchone()[0] == 3
    conn.close()


def test_migrating_an_old_history_table_adds_the_column_without_touching_rows(db) -> None:
    conn = _connect(db)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("DROP INDEX item_changes_xid_idx; ALTER TABLE item_changes DROP COLUMN xid")
        _change(cur, "before")
        history.ensure(cur)
        _change(cur, "after")
        cur.execute("SELECT key->>0, xid IS NULL FROM item_changes ORDER BY id")
        assert cur.fetchall() == [("before", True), ("after", False)]
        cur.execute("SELECT to_regclass('item_changes_xid_idx') IS NOT NULL")
        assert cur.fetchone()[0]
    conn.close()


# --- sinks ------------------------------------------------------------------------------------

RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("NATS_URL", "nats://127.0.0.1:4222")


def _conf(**overrides: object) -> feed_config.FeedConfig:
    settings = Settings({"CHANGEFEED_RETRY_MAX_GAP": "0.5", "CHANGEFEED_PUBLISH_TIMEOUT": "10", **overrides})
    return feed_config.read(settings)


def _relay_once(services, sink, conf, name=None):
    relay = Relay(services.database_url, sink, conf, name=name, say=lambda _text: None)
    return asyncio.run(relay.run(follow=False))


def _published(services, sink: str) -> int:
    rows = services.query("SELECT published FROM change_feed_positions WHERE sink = %s", (sink,))
    return rows[0][0] if rows else 0


def _history_ids(services) -> list[int]:
    return [r[0] for r in services.query("SELECT id FROM item_changes ORDER BY id")]


def _write_changes(services, n: int, keys: int = 5) -> None:
    conn = _connect(services)
    with conn, conn.cursor() as cur:
        for i in range(n):
            _change(cur, f"k{i % keys}", f"n{i}")
    conn.close()


@pytest.fixture
def stream_name():
    name = f"test_feed_{uuid.uuid4().hex[:12]}"
    yield name
    with contextlib.suppress(Exception):
        connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
        connection.channel().queue_delete(name)
        connection.close()

    async def drop() -> None:
        nc = await nats.connect(NATS_URL)
        try:
            await nc.jetstream().delete_stream(name.upper())
        except Exception:  # noqa: BLE001 - a test that made no stream
            pass
        await nc.close()

    asyncio.run(drop())


def read_rabbitmq_stream(name: str, expect: int, idle: float = 1.0) -> list:
    """Every message of stream *name* from the first, with pika (not the relay's client): until
    *expect* distinct ids came and the stream then stayed quiet for *idle* seconds (copies of an
    id may follow), or 60 s passed."""
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=500)
    out = []
    ids: set[str] = set()
    deadline = time.monotonic() + 60
    for method, props, body in channel.consume(name, arguments={"x-stream-offset": "first"}, inactivity_timeout=idle):
        if method is None:
            if len(ids) >= expect or time.monotonic() > deadline:
                break
            continue
        out.append((props.message_id, props.headers, json.loads(body)))
        ids.add(props.message_id)
        channel.basic_ack(method.delivery_tag)
    channel.cancel()
    connection.close()
    return out


def read_nats_stream(stream: str) -> list:
    """Every message of JetStream *stream*, with a consumer of nats-py's own."""

    async def main() -> list:
        nc = await nats.connect(NATS_URL)
        js = nc.jetstream()
        info = await js.stream_info(stream)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(stream, seq)
            out.append((msg.headers.get("Nats-Msg-Id"), msg.subject, json.loads(msg.data)))
        await nc.close()
        return out

    return asyncio.run(main())


def test_rabbitmq_stream_gets_every_event_once_in_order(db, stream_name) -> None:
    _write_changes(db, 40)
    conf = _conf()
    sink = RabbitMQSink(RABBITMQ_URL, stream_name, timeout=10)
    progress = _relay_once(db, sink, conf, name=stream_name)
    ids = _history_ids(db)
    assert progress.published == 40
    got = read_rabbitmq_stream(stream_name, 40)
    assert [int(m) for m, _h, _b in got] == ids
    message_id, headers, body = got[0]
    assert body["id"] == int(message_id) and body["table"] == "feed_items" and body["kind"] == "update"
    assert headers["key"] == '["k0"]' and headers["kind"] == "update"
    # A second relay run finds nothing new: nothing is sent twice.
    assert _relay_once(db, RabbitMQSink(RABBITMQ_URL, stream_name), conf, name=stream_name).published == 0
    _write_changes(db, 3)
    assert _relay_once(db, RabbitMQSink(RABBITMQ_URL, stream_name), conf, name=stream_name).published == 3
    assert [int(m) for m, _h, _b in read_rabbitmq_stream(stream_name, 43)] == _history_ids(db)


def test_nats_stream_stores_each_event_id_once(db, stream_name) -> None:
    _write_changes(db, 30)
    conf = _conf()
    stream, subject = stream_name.upper(), stream_name
    progress = _relay_once(db, NatsSink(NATS_URL, stream, subject, timeout=10), conf, name=stream_name)
    assert progress.published == 30
    got = read_nats_stream(stream)
    assert [int(m) for m, _s, _b in got] == _history_ids(db)
    assert got[0][1] == f"{subject}.feed_items.update"

    # The relay died after the broker stored a batch, before its position was saved: the same
    # batch again is dropped by JetStream (same Nats-Msg-Id within the duplicate window).
    async def resend() -> None:
        sink = NatsSink(NATS_URL, stream, subject, timeout=10)
        await sink.open()
        conn = _connect(db)
        with conn.cursor() as cur:
            cur.execute(f"SELECT {events.COLUMNS} FROM item_changes ORDER BY id")
            batch = [events.Event.from_row(r) for r in cur.fetchall()]
        conn.close()
        await sink.publish(batch)
        await sink.close()

    asyncio.run(resend())
    assert len(read_nats_stream(stream)) == 30


def test_a_duplicate_window_shorter_than_the_retry_gap_is_refused() -> None:
    with pytest.raises(ConfigError, match="CHANGEFEED_NATS_DUPLICATE_WINDOW"):
        _conf(CHANGEFEED_NATS_DUPLICATE_WINDOW="20", CHANGEFEED_RETRY_MAX_GAP="15", CHANGEFEED_PUBLISH_TIMEOUT="10")
    with pytest.raises(ConfigError, match="CHANGEFEED_BATCH"):
        _conf(CHANGEFEED_BATCH="many")
    with pytest.raises(ConfigError, match="CHANGEFEED_RABBITMQ_URL") as refused:
        _conf(CHANGEFEED_RABBITMQ_URL="http://user:hunter2secret@127.0.0.1/")
    assert "hunter2secret" not in str(refused.value)


class Receiver:
    """A webhook receiver of the test's own: checks each signature, answers with the statuses
    it is given (then 200), keeps what it accepted."""

    def __init__(self, secret: str, statuses: list[int]) -> None:
        self.secret = secret
        self.statuses = list(statuses)
        self.accepted: list[dict] = []
        self.requests = 0
        self.bad_signatures = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests += 1
                expected = signature(receiver.secret, self.headers["X-Changefeed-Timestamp"], body)
                if not hmac.compare_digest(expected, self.headers.get("X-Changefeed-Signature", "")):
                    receiver.bad_signatures += 1
                    status = 401
                else:
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                if status == 200:
                    receiver.accepted.extend(json.loads(body)["events"])
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


WEBHOOK_SECRET = "s3cr3t-webhook-key-0123456789"


def test_webhook_signed_retried_then_delivered(db) -> None:
    _write_changes(db, 12)
    with Receiver(WEBHOOK_SECRET, [503, 500]) as receiver:
        conf = _conf(CHANGEFEED_BATCH="5")
        progress = _relay_once(db, WebhookSink(receiver.url, WEBHOOK_SECRET, tries=4, timeout=5, max_gap=0.2), conf)
    assert progress.published == 12 and progress.dead == 0
    assert receiver.bad_signatures == 0 and receiver.requests == 3 + 2  # 3 batches, 2 refused once
    assert [e["id"] for e in receiver.accepted] == _history_ids(db)


def test_webhook_dead_letters_after_the_last_try_and_verify_says_so(db) -> None:
    _write_changes(db, 6)
    with Receiver(WEBHOOK_SECRET, [500] * 3 + [422]) as receiver:
        conf = _conf(CHANGEFEED_BATCH="3")
        progress = _relay_once(db, WebhookSink(receiver.url, WEBHOOK_SECRET, tries=3, timeout=5, max_gap=0.1), conf)
    assert progress.dead == 6 and progress.published == 0
    dead = db.query("SELECT event_id, reason FROM change_feed_dead_letters ORDER BY event_id")
    ids = _history_ids(db)
    assert [d[0] for d in dead] == ids
    assert dead[0][1] == "HTTP 500 after 3 tries" and dead[-1][1] == "refused: HTTP 422"
    conn = _connect(db)
    (check,) = verify.check(conn)
    conn.close()
    assert check.rows == 6 and check.delivered == 0 and any("dead letters" in p for p in check.problems)


def test_webhook_with_a_wrong_secret_stops_the_relay_and_loses_nothing(db) -> None:
    _write_changes(db, 4)
    with Receiver(WEBHOOK_SECRET, []) as receiver:
        sink = WebhookSink(receiver.url, "another-secret-0123456789", tries=3, timeout=5, max_gap=0.1)
        with pytest.raises(SinkFatal, match="401"):
            _relay_once(db, sink, _conf())
        assert receiver.requests == 1
        assert db.query("SELECT count(*) FROM change_feed_dead_letters") == [(0,)]
        progress = _relay_once(db, WebhookSink(receiver.url, WEBHOOK_SECRET, tries=3, timeout=5, max_gap=0.1), _conf())
    assert progress.published == 4 and [e["id"] for e in receiver.accepted] == _history_ids(db)


# --- commands ---------------------------------------------------------------------------------


def _feed_env(services, **extra: str) -> dict[str, str]:
    return crawl_env(services, CHANGEFEED_RETRY_MAX_GAP="0.5", CHANGEFEED_PUBLISH_TIMEOUT="5", **extra)


def test_feed_commands_run_verify_status(db, stream_name) -> None:
    env = _feed_env(
        db,
        CHANGEFEED_NATS_URL=NATS_URL,
        CHANGEFEED_NATS_STREAM=stream_name.upper(),
        CHANGEFEED_NATS_SUBJECT=stream_name,
    )
    before = run_scrapy(env, "feed", "verify")
    assert before.returncode == 1 and "no sink has a position yet" in before.stderr
    _write_changes(db, 25)
    ran = run_scrapy(env, "feed", "run", "--sink", "nats", "--once")
    assert ran.returncode == 0, ran.stderr
    assert "feed nats: 25 events published" in ran.stderr
    ok = run_scrapy(env, "feed", "verify")
    assert ok.returncode == 0 and "nats: ok, 25 events delivered = 25 rows of item_changes (all history)" in ok.stdout
    run_ok = run_scrapy(env, "feed", "verify", "--run", "t:1")
    assert run_ok.returncode == 0 and "25 events delivered = 25 rows" in run_ok.stdout
    other_run = run_scrapy(env, "feed", "verify", "--run", "t:2")
    assert other_run.returncode == 0 and "0 events delivered = 0 rows" in other_run.stdout
    _write_changes(db, 3)
    behind = run_scrapy(env, "feed", "verify")
    assert behind.returncode == 1
    assert "nats: 25 of 28 events delivered (all history): 3 events not published yet (no relay" in behind.stdout
    status = run_scrapy(env, "feed", "status")
    assert status.returncode == 0 and "nats: 25 delivered, 3 waiting, 0 dead letters" in status.stdout
    assert len(read_nats_stream(stream_name.upper())) == 25


def test_feed_settings_checked_and_secrets_never_shown(db, stream_name) -> None:
    bad = run_scrapy(_feed_env(db, CHANGEFEED_BATCH="0"), "feed", "run", "--sink", "nats")
    assert bad.returncode == 2 and "error: CHANGEFEED_BATCH: must be at least 1" in bad.stderr
    missing = run_scrapy(_feed_env(db), "feed", "run", "--sink", "webhook")
    assert missing.returncode == 2 and "CHANGEFEED_WEBHOOK_URL: not set" in missing.stderr
    _write_changes(db, 2)
    password = "wrong-pw-84721"
    env = _feed_env(
        db,
        CHANGEFEED_RABBITMQ_URL=f"amqp://guest:{password}@127.0.0.1:5672/",
        CHANGEFEED_RABBITMQ_STREAM=stream_name,
    )
    refused = run_scrapy(env, "feed", "run", "--sink", "rabbitmq", "--once", "-L", "DEBUG")
    assert refused.returncode == 1 and "nothing was lost" in refused.stderr
    assert "rabbitmq" in refused.stderr and password not in refused.stderr + refused.stdout
    assert db.query("SELECT coalesce(sum(published), 0) FROM change_feed_positions") == [(0,)]


# --- the relay killed at random points ---------------------------------------------------------

KILLS_PER_SINK = 50
KILLING_SECONDS = 30  # a loaded machine gets fewer kills in this time...
MIN_MID_STREAM = 10  # ...but never fewer than this many after a relay's progress,
KILLING_CEILING = 120  # unless even this is not enough (then the assertion below says so)


def _relay_child(dsn: str, kind: str, settings: dict, name: str) -> None:
    """A relay process as `scrapy feed run --sink KIND` runs it (the same Relay, sink and
    settings), forked from a server that imported them already so that it starts in
    milliseconds and can be killed many times within the test's time."""
    conf = feed_config.read(Settings(settings))
    relay = Relay(dsn, feed_sinks.make(kind, conf), conf, name=name, say=lambda _text: None)
    asyncio.run(relay.run(follow=True))


class GadgetWriter(threading.Thread):
    """Commits inserts, changes, gone-marks and returns of its own keys as a crawl does: the
    upsert and its history in one transaction, gone-marks with theirs; transactions held open
    for a random while, so two writers commit out of id order."""

    def __init__(self, services, prefix: str, seed: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.services, self.prefix, self.rng, self.stop = services, prefix, random.Random(seed), stop
        self.error: BaseException | None = None
        self.counts = {"insert": 0, "update": 0, "gone": 0, "back": 0}

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _run(self) -> None:
        rng = self.rng
        conn = psycopg2.connect(self.services.database_url)
        upserter = TableUpserter("gadgets", GADGET_COLUMNS, ("shop", "code"), 3600.0, spider="t", track=True)
        codes = [f"{self.prefix}{i:02d}" for i in range(15)]
        version = dict.fromkeys(codes, 0)
        while not self.stop.is_set():
            with conn, conn.cursor() as cur:
                if rng.random() < 0.2:
                    gone = sorted(rng.sample(codes, 2))
                    cur.execute(
                        "WITH g AS (UPDATE gadgets SET gone_at = now() WHERE shop = 's' AND code = ANY(%s)"
                        " AND gone_at IS NULL RETURNING code)"
                        " INSERT INTO item_changes (item_table, key, kind, reason, spider, run_id)"
                        " SELECT 'gadgets', jsonb_build_array('s', code), 'gone', 'crawl', 't', 1 FROM g ORDER BY code",
                        (gone,),
                    )
                    self.counts["gone"] += cur.rowcount
                else:
                    rows = []
                    for code in sorted(rng.sample(codes, rng.randint(1, 4))):
                        version[code] += 1
                        rows.append(gadget_row(code, f"v{version[code]}", f"{rng.randint(1, 500)}.00"))
                    result = upserter.write(cur, rows)
                    history.record(cur, "gadgets", result.changes, history.Context("t", 1))
                    for change in result.changes:
                        self.counts[change.kind] += 1
                time.sleep(rng.random() * 0.02)
            time.sleep(rng.random() * 0.01)
        conn.close()


def _rebuild(events_in_order: list[dict]) -> dict:
    """What a consumer that dedupes by id builds from the feed: each gadget's name, price and
    whether it is gone."""
    state: dict[str, dict] = {}
    for event in events_in_order:
        row = state.setdefault(event["key"][1], {"gone": False})
        for column, (_old, new) in event["changes"].items():
            row[column] = new
        row["gone"] = event["kind"] == "gone"
    return {
        code: (r.get("name"), float(r["price"]) if r.get("price") is not None else None, r["gone"])
        for code, r in state.items()
    }


def _dedupe(messages: list[tuple[str, dict]]) -> tuple[list[dict], int]:
    seen: set[str] = set()
    out = []
    for message_id, body in messages:
        if message_id not in seen:
            seen.add(message_id)
            out.append(body)
    return out, len(messages) - len(out)


def test_relay_killed_at_random_points_loses_nothing_and_keeps_order(db, stream_name) -> None:
    conn = _connect(db)
    schema.migrate(conn, [Gadget])
    conn.close()
    settings = {
        "CHANGEFEED_BATCH": "25",
        "CHANGEFEED_POLL_INTERVAL": "0.05",
        "CHANGEFEED_RETRY_MAX_GAP": "0.5",
        "CHANGEFEED_PUBLISH_TIMEOUT": "10",
        "CHANGEFEED_RABBITMQ_URL": RABBITMQ_URL,
        "CHANGEFEED_RABBITMQ_STREAM": stream_name,
        "CHANGEFEED_NATS_URL": NATS_URL,
        "CHANGEFEED_NATS_STREAM": stream_name.upper(),
        "CHANGEFEED_NATS_SUBJECT": stream_name,
    }
    context = multiprocessing.get_context("forkserver")
    # This module too: each child unpickles its target from it.
    context.set_forkserver_preload(
        ["scraper.feed.relay", "scraper.feed.sinks.rabbitmq", "scraper.feed.sinks.nats", __name__]
    )
    stop = threading.Event()  # the writers commit until the last kill
    writers = [GadgetWriter(db, prefix, seed, stop) for seed, prefix in enumerate("ab")]
    for w in writers:
        w.start()
    kills = {"rabbitmq": 0, "nats": 0}
    kills_mid_stream = {"rabbitmq": 0, "nats": 0}
    died: dict[str, str] = {}

    def killer(kind: str, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(KILLS_PER_SINK):
            elapsed = time.monotonic() - started
            if elapsed > KILLING_CEILING or (elapsed > KILLING_SECONDS and kills_mid_stream[kind] >= MIN_MID_STREAM):
                break
            before = _published(db, kind)
            child = context.Process(target=_relay_child, args=(db.database_url, kind, settings, kind))
            child.start()
            if rng.random() < 0.3:  # anywhere: starting, connecting, waiting for the lock, publishing
                time.sleep(rng.uniform(0.0, 0.5))
            else:  # while publishing: a random moment after its first saved batch
                deadline = time.monotonic() + 5
                while _published(db, kind) == before and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 0.3))
            if child.exitcode is not None:  # a relay in follow mode ends only when killed
                died[kind] = f"the relay exited by itself with {child.exitcode}"
                return
            os.kill(child.pid, signal.SIGKILL)
            child.join()
            kills[kind] += 1
            if _published(db, kind) > before:
                kills_mid_stream[kind] += 1

    killers = [threading.Thread(target=killer, args=(kind, n)) for n, kind in enumerate(kills)]
    started = time.monotonic()
    for k in killers:
        k.start()
    for k in killers:
        k.join()
    killed = time.monotonic() - started
    stop.set()
    assert not died, died
    for w in writers:
        w.join()
        assert w.error is None, w.error
    # The last relay of each sink, the real command, publishes what is left.
    env = crawl_env(db, **{k: v for k, v in settings.items() if k != "CHANGEFEED_POLL_INTERVAL"})
    for kind in kills:
        done = run_scrapy(env, "feed", "run", "--sink", kind, "--once")
        assert done.returncode == 0, done.stderr
    verified = run_scrapy(env, "feed", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr

    ids = _history_ids(db)
    ordered = db.query("SELECT key->>1, id FROM item_changes ORDER BY id")
    per_key_ids: dict[str, list[int]] = {}
    for code, event_id in ordered:
        per_key_ids.setdefault(code, []).append(event_id)
    stored = {
        code: (name, float(price) if price is not None else None, gone)
        for code, name, price, gone in db.query("SELECT code, name, price, gone_at IS NOT NULL FROM gadgets")
    }
    kinds = {kind for (kind,) in db.query("SELECT DISTINCT kind FROM item_changes")}
    assert kinds == {"insert", "update", "gone", "back"}, kinds

    rabbit = [(m, b) for m, _h, b in read_rabbitmq_stream(stream_name, len(ids))]
    nats_messages = [(m, b) for m, _s, b in read_nats_stream(stream_name.upper())]
    report = {}
    for kind, messages in (("rabbitmq", rabbit), ("nats", nats_messages)):
        delivered, duplicates = _dedupe(messages)
        assert sorted(e["id"] for e in delivered) == ids, f"{kind}: events lost or invented"
        got_per_key: dict[str, list[int]] = {}
        for event in delivered:
            got_per_key.setdefault(event["key"][1], []).append(event["id"])
        assert got_per_key == per_key_ids, f"{kind}: an item's events out of commit order"
        assert _rebuild(delivered) == stored, f"{kind}: the consumer's state differs from Postgres"
        report[kind] = (kills[kind], kills_mid_stream[kind], len(messages), duplicates)
    # JetStream dropped every copy the killed relays sent again (same Nats-Msg-Id, in the window).
    assert report["nats"][3] == 0
    assert min(kills_mid_stream.values()) >= MIN_MID_STREAM, kills_mid_stream  # the test proves something
    print(
        f"kills took {killed:.1f} s; events {len(ids)}; per sink (kills, kills after progress, messages, duplicates): {report}"
    )


# --- the lake -------------------------------------------------------------------------------


def test_lake_changes_appended_current_upserted_and_verified(db, tmp_path) -> None:
    # Here, not at the top: every relay process of the kill test imports this module.
    import pyarrow.parquet as pq
    from pyiceberg.catalog.sql import SqlCatalog

    conn = _connect(db)
    schema.migrate(conn, [Gadget])
    upserter = TableUpserter("gadgets", GADGET_COLUMNS, ("shop", "code"), 3600.0, spider="t", track=True)

    def write(rows) -> None:
        with conn, conn.cursor() as cur:
            result = upserter.write(cur, rows)
            history.record(cur, "gadgets", result.changes, history.Context("t", 1))

    write([gadget_row(f"c{i:02d}", f"n{i}", "1.00") for i in range(20)])
    write([gadget_row(f"c{i:02d}", f"m{i}", "2.50") for i in range(5)])
    with conn, conn.cursor() as cur:
        cur.execute(
            "WITH g AS (UPDATE gadgets SET gone_at = now() WHERE code IN ('c17', 'c18', 'c19') RETURNING code)"
            " INSERT INTO item_changes (item_table, key, kind, reason, spider, run_id)"
            " SELECT 'gadgets', jsonb_build_array('s', code), 'gone', 'crawl', 't', 1 FROM g ORDER BY code"
        )
    write([gadget_row("c19", "back again", "3.00")])
    _write_changes(db, 3, keys=3)  # a table that writes history without the item bookkeeping
    folder = str(tmp_path / "lake")
    conf = _conf(CHANGEFEED_BATCH="12", CHANGEFEED_LAKE_FOLDER=folder)
    progress = _relay_once(db, feed_sinks.make("lake", conf, db.database_url), conf)
    ids = _history_ids(db)
    assert progress.published == len(ids) == 20 + 5 + 3 + 1 + 3

    # Read back with pyiceberg's own scan, and the Parquet files with pyarrow alone.
    catalog = SqlCatalog("changefeed", uri="postgresql+psycopg2" + db.database_url[len("postgresql") :])
    changes = catalog.load_table("changefeed.changes")
    assert sorted(changes.scan().to_arrow().column("id").to_pylist()) == ids
    assert changes.current_snapshot().summary.additional_properties["changefeed.last_event_id"] == str(ids[-1])
    files = [str(p) for p in (tmp_path / "lake").rglob("*.parquet") if "/changes/" in str(p)]
    assert sorted(pq.read_table(files, partitioning=None).column("id").to_pylist()) == ids
    current = {r["key"]: r for r in catalog.load_table("changefeed.current").scan().to_arrow().to_pylist()}
    assert len(current) == 20 + 3 and current['["k1"]']["gone"] is False
    assert current['["s","c18"]']["gone"] is True and current['["s","c19"]']["gone"] is False
    assert json.loads(current['["s","c19"]']["row"])["name"] == "back again"
    assert json.loads(current['["s","c00"]']["row"])["name"] == "m0"

    # The relay died after the lake committed its last batch: the batch comes again, once.
    rows = db.query(f"SELECT {events.COLUMNS} FROM item_changes ORDER BY id")
    last_batch = [events.Event.from_row(r) for r in rows][-5:]  # 32 events in batches of 12
    again = feed_sinks.make("lake", conf, db.database_url)
    asyncio.run(again.publish(last_batch))
    asyncio.run(again.close())
    assert len(catalog.load_table("changefeed.changes").scan().to_arrow()) == len(ids)

    env = crawl_env(db, CHANGEFEED_LAKE_FOLDER=folder)
    ok = run_scrapy(env, "feed", "verify")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "lake current: 23 rows, Postgres 23: 0 differ, 0 missing from the lake, 0 only in the lake" in ok.stdout
    with conn, conn.cursor() as cur:  # a change that bypassed the history
        cur.execute("UPDATE gadgets SET name = 'x', content_hash = 'x' WHERE code = 'c03'")
    drift = run_scrapy(env, "feed", "verify")
    assert drift.returncode == 1 and "1 differ" in drift.stdout and "differs from Postgres" in drift.stdout
    conn.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("scraper_changefeed_")
    }


def test_metrics_say_when_the_sink_is_away_and_what_went_out(db, stream_name) -> None:
    _write_changes(db, 9)
    conf = _conf()
    port = _free_port()
    metrics = FeedMetrics("nats")
    server = metrics.serve("127.0.0.1", port)
    said: list[str] = []

    async def away_then_back() -> dict:
        closed = f"nats://127.0.0.1:{_free_port()}"  # nothing listens there
        relay = Relay(db.database_url, NatsSink(closed, "X", "x", timeout=1), conf, say=said.append, metrics=metrics)
        task = asyncio.ensure_future(relay.run(follow=True))
        await asyncio.sleep(1.5)
        away = await asyncio.to_thread(_scrape, port)
        relay.stop()
        await task
        sink = NatsSink(NATS_URL, stream_name.upper(), stream_name, timeout=10)
        back = Relay(db.database_url, sink, conf, say=said.append, metrics=metrics)
        await back.run(follow=False)
        return away

    away = asyncio.run(away_then_back())
    after = _scrape(port)
    server.shutdown()
    assert away['scraper_changefeed_sink_up{sink="nats"}'] == 0
    assert any("nats unreachable" in line and "waiting" in line for line in said), said
    assert after['scraper_changefeed_sink_up{sink="nats"}'] == 1
    assert after['scraper_changefeed_events_published_total{sink="nats"}'] == 9
    assert after['scraper_changefeed_last_publish_timestamp_seconds{sink="nats"}'] > time.time() - 60


# --- a consumer that starts late ----------------------------------------------------------------


def _stored_gadgets(services) -> dict:
    return {
        code: (name, float(price) if price is not None else None, gone)
        for code, name, price, gone in services.query("SELECT code, name, price, gone_at IS NOT NULL FROM gadgets")
    }


def _rabbitmq_from(name: str, offset: object, expect_last: int) -> list[tuple[int, dict, int]]:
    """Stream *name* read with pika from *offset* (a number, or a time) until the event
    *expect_last* came: (event id, event, stream offset) each."""
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    out = []
    deadline = time.monotonic() + 30
    for method, props, body in channel.consume(name, arguments={"x-stream-offset": offset}, inactivity_timeout=1):
        if method is None:
            if time.monotonic() > deadline:
                break
            continue
        out.append((int(props.message_id), json.loads(body), props.headers["x-stream-offset"]))
        channel.basic_ack(method.delivery_tag)
        if out[-1][0] == expect_last:
            break
    channel.cancel()
    connection.close()
    return out


def _nats_from(stream: str, subject: str, **start: object) -> list[dict]:
    """Every event of JetStream *stream* from a start sequence or time, with an ephemeral
    consumer of nats-py's own."""
    from nats.js.api import ConsumerConfig, DeliverPolicy

    async def main() -> list[dict]:
        nc = await nats.connect(NATS_URL)
        js = nc.jetstream()
        policy = DeliverPolicy.BY_START_SEQUENCE if "opt_start_seq" in start else DeliverPolicy.BY_START_TIME
        sub = await js.pull_subscribe(
            f"{subject}.>", stream=stream, config=ConsumerConfig(deliver_policy=policy, **start)
        )
        out = []
        while True:
            try:
                batch = await sub.fetch(100, timeout=1)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            for msg in batch:
                out.append(json.loads(msg.data))
                await msg.ack()
        await nc.close()
        return out

    return asyncio.run(main())


def test_a_late_consumer_replays_from_an_offset_or_a_time_and_rebuilds_postgres(db, stream_name) -> None:
    writer = GadgetHistory(db.database_url)
    write = writer.write

    conf = _conf()
    stream, subject = stream_name.upper(), stream_name

    def relay() -> None:
        _relay_once(db, RabbitMQSink(RABBITMQ_URL, stream_name, timeout=10), conf, name="rabbitmq")
        _relay_once(db, NatsSink(NATS_URL, stream, subject, timeout=10), conf, name="nats")

    write([gadget_row(f"c{i:02d}", f"n{i}", "1.00") for i in range(12)])
    relay()
    first = _history_ids(db)
    # A consumer read everything so far, kept its state and its place, and then stopped.
    early = _rabbitmq_from(stream_name, "first", first[-1])
    assert [i for i, _e, _o in early] == first
    kept_offset = early[-1][2]
    time.sleep(1.5)  # stream timestamps are in seconds
    since = datetime.now(UTC)
    time.sleep(1.5)

    # Meanwhile: changes, gone-marks and returns.
    write([gadget_row(f"c{i:02d}", f"m{i}", "2.50") for i in range(4)])
    writer.gone(["c09", "c10", "c11"])
    write([gadget_row("c11", "back again", "3.00")])
    relay()
    later = [i for i in _history_ids(db) if i > first[-1]]
    kinds = {k for (k,) in db.query("SELECT DISTINCT kind FROM item_changes WHERE id > %s", (first[-1],))}
    assert kinds == {"update", "gone", "back"}
    stored = _stored_gadgets(db)

    # RabbitMQ, from the offset after the consumer's last: exactly what it missed.
    by_offset = _rabbitmq_from(stream_name, kept_offset + 1, later[-1])
    assert [i for i, _e, _o in by_offset] == later
    assert _rebuild([e for _i, e, _o in early] + [e for _i, e, _o in by_offset]) == stored
    # From a time: the stream starts at the chunk holding it (maybe earlier), so a consumer skips
    # what it applied already, by id.
    by_time = [e for i, e, _o in _rabbitmq_from(stream_name, since, later[-1]) if i > first[-1]]
    assert [e["id"] for e in by_time] == later
    assert _rebuild([e for _i, e, _o in early] + by_time) == stored

    # NATS JetStream, by start time and by sequence (a fresh consumer: the whole history).
    from_time = _nats_from(stream, subject, opt_start_time=since.isoformat().replace("+00:00", "Z"))
    assert [e["id"] for e in from_time] == later
    everything = _nats_from(stream, subject, opt_start_seq=1)
    assert [e["id"] for e in everything] == _history_ids(db)
    assert _rebuild(everything) == stored
    assert stored["c10"][2] is True and stored["c11"] == ("back again", 3.0, False)
    writer.close()
