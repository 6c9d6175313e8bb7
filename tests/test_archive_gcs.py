"""The raw archive in a Google Cloud Storage bucket, against a real local GCS server (the
``gcp-storage-emulator`` from PyPI), the bucket made and read back with Google's own client:
the store's five operations, a crawl archived to ``gs://`` and replayed from it, retention, and
bad settings failing at start by name."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta

import google.auth.credentials
import pytest
from google.cloud import storage
from scrapy.settings import Settings
from support.crawls import crawl, crawl_env, run_scrapy
from support.processes import free_port
from warcio.archiveiterator import ArchiveIterator

from scraper.archive.config import read_config
from scraper.archive.gcs import GcsStore
from scraper.config import ConfigError

# The emulator serves one request at a time, and pyarrow starts a whole-object GET before its
# first ranged read (see GcsStore.read): an object larger than the loopback socket buffers
# (measured: 4 MB reads, 5 MB stalls) would hold the emulator. Test files stay far below.
SMALL_FILES = "40000"


@pytest.fixture
def gcs_server(monkeypatch):
    port = free_port()
    proc = subprocess.Popen(
        [
            os.path.join(os.path.dirname(sys.executable), "gcp-storage-emulator"),
            "start",
            "--host=127.0.0.1",
            f"--port={port}",
            "--in-memory",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)  # read by Google's client, not by ours
    client = storage.Client(project="test", credentials=google.auth.credentials.AnonymousCredentials())
    for _ in range(100):
        try:
            bucket = client.create_bucket("archive")
            break
        except Exception:
            time.sleep(0.1)
    else:
        raise AssertionError("the GCS emulator did not start")
    yield endpoint, bucket, proc
    proc.terminate()
    proc.wait(timeout=10)


def gcs_env(clean, endpoint: str, data_dir: str, **extra: str) -> dict[str, str]:
    env = crawl_env(clean, ARCHIVE_URL="gs://archive/warc", ARCHIVE_GCS_ENDPOINT=endpoint, DATA_DIR=data_dir, **extra)
    # The crawl finds the emulator through ARCHIVE_GCS_ENDPOINT alone, not the test client's variable.
    env.pop("STORAGE_EMULATOR_HOST", None)
    return env


def test_gcs_store_uploads_whole_files_and_reads_ranges_back(gcs_server, tmp_path) -> None:
    endpoint, bucket, proc = gcs_server
    store = GcsStore("gs://archive/warc/", str(tmp_path / "spool"), endpoint)
    assert store.location == f"gs://archive/warc at {endpoint}"
    files = {
        f"demo/2026/01/0{i}/demo-{i}.warc.gz": gzip.compress(os.urandom(50_000 * (i + 1)), compresslevel=1)
        for i in range(3)
    }
    started = time.monotonic()
    for name, data in files.items():
        spooled = store.local_path(name)
        with open(spooled, "wb") as f:
            f.write(data)
        store.publish(name)
        assert not os.path.exists(spooled)  # uploaded, so no longer spooled
    uploaded = time.monotonic() - started
    # Byte for byte what was spooled: pyarrow would gzip a ".gz" name again unless told not to.
    assert {b.name: b.download_as_bytes() for b in bucket.list_blobs()} == {f"warc/{n}": d for n, d in files.items()}

    bucket.blob("warc/notes.txt").upload_from_string(b"not an archive file")
    bucket.blob("other/demo.warc.gz").upload_from_string(b"another prefix")
    assert sorted(store.names()) == sorted(files)

    name, data = next(iter(files.items()))
    for offset, length in ((0, 100), (12_345, 4_000), (len(data) - 10, 10)):
        assert store.read(name, offset, length) == data[offset : offset + length]
    # Replay reads from a pool of threads, many of them from the same files. (Four: more connect
    # at once than the emulator's listen backlog of five takes, and wait a second to retry.)
    failures: list[BaseException] = []

    def reader(seed: int) -> None:
        try:
            for k in range(40):
                name, data = list(files.items())[(seed + k) % len(files)]
                offset = (seed * 7919 + k * 104_729) % (len(data) - 500)
                assert store.read(name, offset, 500) == data[offset : offset + 500]
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(4)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    read_time = time.monotonic() - started
    assert not failures, failures[0]
    print(f"3 uploads in {uploaded:.3f} s; 160 ranged reads from 4 threads in {read_time:.2f} s")

    store.delete(name)
    store.delete(name)  # already gone: no error
    assert sorted(store.names()) == sorted(set(files) - {name})
    with pytest.raises(OSError):
        store.read(name, 0, 10)
    assert list(GcsStore("gs://archive/nothing-yet", str(tmp_path / "spool"), endpoint).names()) == []
    with pytest.raises(FileNotFoundError, match="'no-such-bucket' does not exist"):
        list(GcsStore("gs://no-such-bucket/warc", str(tmp_path / "spool"), endpoint).names())

    # The server goes away: the upload fails, in bounded time, and the file stays spooled.
    proc.terminate()
    proc.wait(timeout=10)
    hasty = GcsStore("gs://archive/warc", str(tmp_path / "spool"), endpoint, retry_time_limit=timedelta(seconds=2))
    with open(hasty.local_path("demo/late.warc.gz"), "wb") as f:
        f.write(b"late")
    started = time.monotonic()
    with pytest.raises(OSError):
        hasty.publish("demo/late.warc.gz")
    assert time.monotonic() - started < 20
    assert os.path.exists(hasty.local_path("demo/late.warc.gz"))


def test_a_crawl_archived_to_gcs_replays_from_it_and_prunes_it(clean, site, tmp_path, gcs_server) -> None:
    endpoint, bucket, _proc = gcs_server
    data_dir = tmp_path / "data"
    env = gcs_env(clean, endpoint, str(data_dir), ARCHIVE_FILE_SIZE=SMALL_FILES)
    result = crawl(clean, site, **env)
    assert "Archiving every response to gs://archive/warc" in result.stderr
    assert not [f for f in (data_dir / "archive-spool").rglob("*") if f.is_file()]  # every file uploaded
    pages = clean.query("SELECT count(DISTINCT fingerprint) FROM archive_index")[0][0]
    assert pages == len(site.catalog.pages())
    assert clean.query("SELECT DISTINCT archive FROM archive_index") == [(f"gs://archive/warc at {endpoint}",)]

    # The bucket, as Google's client lists it, holds exactly the indexed files, each a WARC file.
    blobs = {b.name: b for b in bucket.list_blobs()}
    indexed = {
        row[0] for row in clean.query("SELECT file FROM archive_index UNION SELECT payload_file FROM archive_index")
    }
    assert set(blobs) == {f"warc/{name}" for name in indexed} and len(blobs) > 1, sorted(blobs)
    kinds: dict[str, int] = {}
    for blob in blobs.values():
        assert blob.name.startswith("warc/demo/") and blob.name.endswith(".warc.gz")
        for record in ArchiveIterator(io.BytesIO(blob.download_as_bytes())):
            kinds[record.rec_type] = kinds.get(record.rec_type, 0) + 1
            record.content_stream().read()
    assert kinds.get("response", 0) + kinds.get("revisit", 0) == clean.query("SELECT count(*) FROM archive_index")[0][0]
    assert kinds.get("revisit", 0) > 0

    # Replayed from the bucket, no fetch: every page read back, the same items (none new, none changed).
    before = clean.query("SELECT sku, title FROM products ORDER BY sku")
    site.stop()
    served = site.stats()["total"]
    replay = run_scrapy(gcs_env(clean, endpoint, str(data_dir)), "reprocess", "demo")
    assert replay.returncode == 0 and "Traceback" not in replay.stderr, replay.stderr[-3000:]
    assert f"reprocess: {pages}/{pages} pages" in replay.stderr, replay.stderr[-3000:]
    assert "0 new, 0 updated" in replay.stderr and "cannot read" not in replay.stderr, replay.stderr[-3000:]
    assert site.stats()["total"] == served
    assert clean.query("SELECT sku, title FROM products ORDER BY sku") == before

    # A clock 31 days ahead: every row is out of the window, and so is every file in the bucket.
    later = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 31 * 86400))
    pruned = run_scrapy(gcs_env(clean, endpoint, str(data_dir)), "archive", "prune", "--now", later)
    assert pruned.returncode == 0, pruned.stderr[-3000:]
    assert f"and {len(blobs)} file(s)" in pruned.stdout, pruned.stdout
    assert clean.query("SELECT count(*) FROM archive_index")[0][0] == 0
    assert list(bucket.list_blobs()) == []


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"ARCHIVE_URL": "gs://"}, "ARCHIVE_URL: 'gs://' names no bucket (expected gs://bucket/prefix)"),
        ({"ARCHIVE_URL": "gs:///warc"}, "ARCHIVE_URL: 'gs:///warc' names no bucket"),
        ({"ARCHIVE_URL": "gs://My Bucket/warc"}, "ARCHIVE_URL: 'My Bucket' is no GCS bucket name"),
        ({"ARCHIVE_URL": "gcs://archive"}, "ARCHIVE_URL: 'gcs://archive' is neither a folder nor s3://"),
        ({"ARCHIVE_GCS_ENDPOINT": "127.0.0.1:9023"}, "ARCHIVE_GCS_ENDPOINT: expected http(s)://host:port"),
        ({"ARCHIVE_GCS_ENDPOINT": "ftp://127.0.0.1:9023"}, "ARCHIVE_GCS_ENDPOINT: expected http(s)://host:port"),
        ({"ARCHIVE_GCS_ENDPOINT": "http://127.0.0.1:port"}, "ARCHIVE_GCS_ENDPOINT: expected http(s)://host:port"),
        ({"ARCHIVE_GCS_ENDPOINT": "http://gcs.local/storage/v1"}, "ARCHIVE_GCS_ENDPOINT: expected http(s)://host:port"),
        ({"ARCHIVE_GCS_ENDPOINT": "https://me:hunter22@gcs.local"}, "ARCHIVE_GCS_ENDPOINT: holds credentials"),
        ({"ARCHIVE_URL": "gs://me:hunter22@archive/warc"}, "ARCHIVE_URL: it is no GCS bucket name"),
    ],
)
def test_a_bad_gcs_setting_is_refused_by_name(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        read_config(Settings({"ARCHIVE_URL": "gs://archive/warc", **settings}))
    assert str(caught.value).startswith(message), str(caught.value)
    assert "hunter22" not in str(caught.value)


def test_the_gcs_endpoint_is_the_one_of_a_gs_archive() -> None:
    both = {"ARCHIVE_S3_ENDPOINT": "http://127.0.0.1:9000", "ARCHIVE_GCS_ENDPOINT": "http://127.0.0.1:9023/"}
    assert read_config(Settings({"ARCHIVE_URL": "gs://archive/warc", **both})).endpoint == "http://127.0.0.1:9023"
    assert read_config(Settings({"ARCHIVE_URL": "s3://archive/warc", **both})).endpoint == "http://127.0.0.1:9000"
    assert read_config(Settings({"ARCHIVE_URL": "/tmp/warc", **both})).endpoint is None
    assert read_config(Settings({"ARCHIVE_URL": "gs://archive"})).endpoint is None  # Google's own


def test_a_crawl_with_a_bucketless_gs_url_fails_at_start_naming_it(clean) -> None:
    result = run_scrapy(crawl_env(clean, ARCHIVE_URL="gs://"), "crawl", "demo")
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    expected = "error: ARCHIVE_URL: 'gs://' names no bucket (expected gs://bucket/prefix)"
    assert errors == [expected], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
