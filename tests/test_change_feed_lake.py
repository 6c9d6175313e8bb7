"""The lake in buckets: Iceberg tables on a real local S3 (moto's server) and GCS endpoint
(gcp-storage-emulator), written by ``scrapy feed run --sink lake`` as a user runs it, read back
with the clouds' official clients and DuckDB; a bucket that stops answering and comes back; the
small files compacted and old snapshots expired; the warehouses' DDL."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import duckdb
import psycopg2
import pyarrow as pa
import pytest
from scrapy.settings import Settings
from support.crawls import crawl_env, run_scrapy
from support.processes import wait_for
from support.storage_items import GadgetHistory
from support.storage_items import row as gadget_row

from scraper.feed import config as feed_config
from scraper.feed import events, position
from scraper.feed.sinks.lake import LakeSink, compare_current
from scraper.storage import history

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "lake-secret-never-shown",
    "AWS_DEFAULT_REGION": "us-east-1",
}
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def db(clean):
    conn = psycopg2.connect(clean.database_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        history.ensure(cur)
        position.ensure(cur)
    conn.close()
    return clean


def _history_ids(services) -> list[int]:
    return [r[0] for r in services.query("SELECT id FROM item_changes ORDER BY id")]


def _lake_env(services, location: str, **extra: str) -> dict[str, str]:
    settings = {"CHANGEFEED_RETRY_MAX_GAP": "0.5", "CHANGEFEED_PUBLISH_TIMEOUT": "6", "CHANGEFEED_BATCH": "10"}
    return crawl_env(services, CHANGEFEED_LAKE_FOLDER=location, **{**settings, **extra})


def _verified(env, rows: int) -> None:
    ok = run_scrapy(env, "feed", "verify")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert (
        f"lake current: {rows} rows, Postgres {rows}: 0 differ, 0 missing from the lake, 0 only in the lake"
        in ok.stdout
    )


def _parquet_ids(paths_or_bytes: list) -> list[int]:
    """Event ids in Parquet data files, read by DuckDB (a reader we did not write)."""
    ids: list[int] = []
    for item in paths_or_bytes:
        ids += [r[0] for r in duckdb.sql(f"SELECT id FROM read_parquet('{item}')").fetchall()]
    return sorted(ids)


# --- S3 ---------------------------------------------------------------------------------------


@pytest.fixture
def s3(tmp_path):
    port = _free_port()
    proc = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )

    def made() -> bool:
        try:
            client.create_bucket(Bucket="lake")
            return True
        except Exception:  # noqa: BLE001 - not listening yet
            return False

    wait_for(made, timeout=30, step=0.1)
    yield endpoint, client
    proc.terminate()
    proc.wait(timeout=10)


def test_lake_on_s3_written_read_back_by_the_official_client_and_duckdb(db, s3, tmp_path) -> None:
    endpoint, client = s3
    writer = GadgetHistory(db.database_url)
    writer.write([gadget_row(f"c{i:02d}", f"n{i}", "1.00") for i in range(20)])
    writer.write([gadget_row(f"c{i:02d}", f"m{i}", "2.50") for i in range(5)])
    writer.gone(["c17", "c18", "c19"])
    writer.write([gadget_row("c19", "back again", "3.00")])
    env = _lake_env(db, "s3://lake/warehouse", CHANGEFEED_LAKE_ENDPOINT=endpoint, **S3_ENV)
    run = run_scrapy(env, "feed", "run", "--sink", "lake", "--once")
    assert run.returncode == 0, run.stderr
    ids = _history_ids(db)
    assert len(ids) == 20 + 5 + 3 + 1
    assert "s3://lake/warehouse" in run.stderr and S3_ENV["AWS_SECRET_ACCESS_KEY"] not in run.stderr + run.stdout
    _verified(env, 20)

    # The bucket, listed by AWS' own client: the tables' Parquet data and Iceberg metadata.
    keys = [
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket="lake")
        for o in page.get("Contents", [])
    ]
    data = [k for k in keys if "/changes/data/" in k and k.endswith(".parquet")]
    assert data and any(k.endswith(".metadata.json") for k in keys)
    local = []
    for i, key in enumerate(data):
        path = tmp_path / f"part{i}.parquet"
        path.write_bytes(client.get_object(Bucket="lake", Key=key)["Body"].read())
        local.append(str(path))
    assert _parquet_ids(local) == ids  # each event once, none missing

    # A warehouse reads the tables from their metadata files in the bucket.
    ddl = run_scrapy(env, "feed", "ddl", "--warehouse", "snowflake", "--volume", "vol")
    assert ddl.returncode == 0, ddl.stderr
    paths = [
        line.split("METADATA_FILE_PATH = '")[1].split("'")[0]
        for line in ddl.stdout.splitlines()
        if "METADATA_FILE_PATH" in line
    ]
    assert len(paths) == 2 and all(f"warehouse/{p}" in keys for p in paths), (paths, keys)
    assert "CATALOG_SOURCE = OBJECT_STORE" in ddl.stdout
    bigquery = run_scrapy(env, "feed", "ddl", "--warehouse", "bigquery")
    assert bigquery.returncode == 2 and "Cloud Storage only" in bigquery.stderr
    writer.close()


# --- GCS, and a bucket that stops answering -----------------------------------------------------


class GcsEmulator:
    """gcp-storage-emulator keeping its buckets in a folder, so it can stop and come back."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [str(BIN / "gcp-storage-emulator"), "start", "--host=127.0.0.1", f"--port={self.port}"],
            cwd=self.folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def answers() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                return False

        wait_for(answers, timeout=30, step=0.1)

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.proc = None

    def client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        os.environ["STORAGE_EMULATOR_HOST"] = self.endpoint
        return storage.Client(project="test", credentials=AnonymousCredentials())


@pytest.fixture
def gcs(tmp_path):
    emulator = GcsEmulator(tmp_path)
    emulator.start()
    emulator.client().create_bucket("lake")
    yield emulator
    if emulator.proc is not None:
        emulator.stop()
    os.environ.pop("STORAGE_EMULATOR_HOST", None)


def test_lake_on_gcs_waits_out_a_bucket_that_stops_answering_and_writes_nothing_twice(db, gcs, tmp_path) -> None:
    writer = GadgetHistory(db.database_url)
    writer.write([gadget_row(f"c{i:02d}", f"n{i}", "1.00") for i in range(12)])
    env = _lake_env(db, "gs://lake/warehouse", CHANGEFEED_LAKE_ENDPOINT=gcs.endpoint, CHANGEFEED_LAKE_TIMEOUT="2")
    first = run_scrapy(env, "feed", "run", "--sink", "lake", "--once")
    assert first.returncode == 0, first.stderr

    gcs.stop()
    writer.write([gadget_row(f"c{i:02d}", f"m{i}", "2.00") for i in range(6)])
    writer.gone(["c10", "c11"])
    started = time.monotonic()
    away = run_scrapy(env, "feed", "run", "--sink", "lake", "--once", timeout=120)
    assert away.returncode == 1, away.stderr
    assert "lake" in away.stderr and "nothing was lost" in away.stderr, away.stderr
    assert time.monotonic() - started < 60  # bounded: it says so and ends, it does not hang

    gcs.start()
    back = run_scrapy(env, "feed", "run", "--sink", "lake", "--once")
    assert back.returncode == 0, back.stderr
    ids = _history_ids(db)
    assert len(ids) == 12 + 6 + 2
    _verified(env, 12)

    # Read back with Google's own client and DuckDB: every event once, gone flags as Postgres.
    client = gcs.client()
    blobs = list(client.list_blobs("lake"))
    data = [b for b in blobs if "/changes/data/" in b.name and b.name.endswith(".parquet")]
    local = []
    for i, blob in enumerate(data):
        path = tmp_path / f"g{i}.parquet"
        path.write_bytes(blob.download_as_bytes())
        local.append(str(path))
    assert _parquet_ids(local) == ids

    ddl = run_scrapy(env, "feed", "ddl", "--warehouse", "bigquery", "--dataset", "shop", "--connection", "p.eu.lake")
    assert ddl.returncode == 0, ddl.stderr
    uris = [line.split('uris = ["')[1].split('"')[0] for line in ddl.stdout.splitlines()]
    names = {b.name for b in blobs}
    assert len(uris) == 2 and all(u.startswith("gs://lake/") and u[len("gs://lake/") :] in names for u in uris)
    assert "CREATE EXTERNAL TABLE IF NOT EXISTS `shop.changefeed_current` WITH CONNECTION `p.eu.lake`" in ddl.stdout
    writer.close()


# --- compaction and expiry --------------------------------------------------------------------


def _lake_state(env) -> dict:
    """The lake's tables as pyiceberg scans them, and their data files."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("changefeed", uri="postgresql+psycopg2" + env["DATABASE_URL"][len("postgresql") :])
    out = {}
    for name in ("changes", "current"):
        table = catalog.load_table(f"changefeed.{name}")
        rows = table.scan().to_arrow().to_pylist()
        out[name] = {
            "rows": sorted(json.dumps(r, sort_keys=True, default=str) for r in rows),
            "files": len(table.inspect.files()),
            "snapshots": len(table.metadata.snapshots),
        }
    return out


def test_compact_rewrites_small_files_expires_snapshots_and_keeps_every_row(db, tmp_path) -> None:
    writer = GadgetHistory(db.database_url)
    folder = tmp_path / "lake"
    env = _lake_env(db, str(folder), CHANGEFEED_BATCH="4")
    for round_ in range(4):  # four relay runs, three or four commits each
        writer.write([gadget_row(f"c{i:02d}", f"n{i}-{round_}", f"{round_ + 1}.00") for i in range(14)])
        run = run_scrapy(env, "feed", "run", "--sink", "lake", "--once")
        assert run.returncode == 0, run.stderr
    before = _lake_state(env)
    assert before["changes"]["files"] >= 10 and before["changes"]["snapshots"] >= 10
    orphan = folder / "changefeed.db" / "changes" / "data" / "orphan-from-a-failed-commit.parquet"
    files_on_disk = {p for p in folder.rglob("*") if p.is_file()}
    if not orphan.parent.exists():  # the layout pyiceberg chose: put it beside the data files
        orphan = next(p for p in files_on_disk if p.suffix == ".parquet" and "/changes/" in str(p)).parent / orphan.name
    orphan.write_bytes(b"PAR1")

    done = run_scrapy(env, "feed", "compact", "--keep-days", "0", "--min-files", "2")
    assert done.returncode == 0, done.stderr
    after = _lake_state(env)
    assert (
        after["changes"]["rows"] == before["changes"]["rows"] and after["current"]["rows"] == before["current"]["rows"]
    )
    assert after["changes"]["files"] == 1 and after["current"]["files"] == 1, after
    assert after["changes"]["snapshots"] == 1 and after["current"]["snapshots"] == 1
    assert "changes:" in done.stdout and "snapshots expired" in done.stdout
    remaining = {p for p in folder.rglob("*") if p.is_file()}
    assert len(remaining) < len(files_on_disk) / 2, (len(remaining), len(files_on_disk))
    assert orphan.exists()  # a day-young file no snapshot used may be a commit in flight
    old = time.time() - 2 * 86400
    os.utime(orphan, (old, old))
    again = run_scrapy(env, "feed", "compact", "--keep-days", "0")
    assert again.returncode == 0 and not orphan.exists(), again.stdout + again.stderr

    # The relay goes on after compaction, and what it wrote still equals Postgres.
    writer.write([gadget_row("c00", "last", "9.00")])
    run = run_scrapy(env, "feed", "run", "--sink", "lake", "--once")
    assert run.returncode == 0, run.stderr
    _verified(env, 14)
    writer.close()


def test_lake_locations_checked_at_start(db) -> None:
    for value, says in (
        ("s3://", "names no bucket"),
        ("gs:///prefix", "names no bucket"),
        ("https://bucket.example/lake", "a folder, s3://bucket/prefix or gs://bucket/prefix"),
    ):
        env = _lake_env(db, value)
        out = run_scrapy(env, "feed", "run", "--sink", "lake", "--once")
        assert out.returncode == 2 and "CHANGEFEED_LAKE_FOLDER" in out.stderr and says in out.stderr, out.stderr
    env = _lake_env(db, "/tmp/no-lake-here-yet")
    out = run_scrapy(env, "feed", "ddl", "--warehouse", "snowflake")
    assert out.returncode == 2 and "Snowflake reads Iceberg tables from a bucket" in out.stderr


def test_a_batch_sent_again_after_only_changes_took_it_still_reaches_current(db, tmp_path) -> None:
    # The commit to `changes` went through, the one to `current` did not (the bucket went away
    # between the two): the relay sends the batch again, and `current` must get it although
    # `changes` already holds every event of it.
    writer = GadgetHistory(db.database_url)
    writer.write([gadget_row(f"c{i:02d}", f"n{i}", "1.00") for i in range(4)])
    env = _lake_env(db, str(tmp_path / "lake"))
    assert run_scrapy(env, "feed", "run", "--sink", "lake", "--once").returncode == 0
    writer.write([gadget_row("c01", "changed", "5.00")])
    conf = feed_config.read(Settings({"CHANGEFEED_LAKE_FOLDER": str(tmp_path / "lake")}))
    rows = db.query(f"SELECT {events.COLUMNS} FROM item_changes ORDER BY id")
    batch = [events.Event.from_row(r) for r in rows][-1:]
    sink = LakeSink(db.database_url, conf.lake_folder)
    asyncio.run(sink.open())
    sink._changes.append(  # what the first try committed before failing
        pa.Table.from_pylist(
            [{"id": e.id, "item_table": e.item_table, "key": json.dumps(e.key, separators=(",", ":"))} for e in batch],
            schema=sink._changes.schema().as_arrow(),
        )
    )
    asyncio.run(sink.close())
    resend = LakeSink(db.database_url, conf.lake_folder)
    asyncio.run(resend.publish(batch))
    asyncio.run(resend.close())
    found = compare_current(db.database_url, conf.lake_folder, conf.lake_namespace)
    assert found == {"postgres": 4, "lake": 4, "differ": 0, "missing": 0, "extra": 0}
    writer.close()
