"""The raw archive end to end: WARC files and their index, reprocessing with no network, the
same result from a folder and from a real local S3 server (moto's standalone server), retention,
and secrets kept out."""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from support.crawls import ROOT, crawl, crawl_env, project_with_text_cleaner, run_scrapy
from support.queue import queue_depth

from scraper.scraping_api.standin import StandIn

S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


_S3_SERVERS: dict[str, subprocess.Popen] = {}


def s3_server_stop(endpoint: str) -> None:
    proc = _S3_SERVERS.pop(endpoint)
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def s3_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    _S3_SERVERS[endpoint] = proc
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        **{k.lower(): v for k, v in S3_ENV.items() if k != "AWS_DEFAULT_REGION"},
        region_name="us-east-1",
    )
    for _ in range(100):
        try:
            client.create_bucket(Bucket="archive")
            break
        except Exception:
            time.sleep(0.1)
    yield endpoint, client
    _S3_SERVERS.pop(endpoint, None)
    proc.terminate()
    proc.wait(timeout=10)


def index_view(clean) -> tuple[list[tuple], list[tuple]]:
    # Which of two identical bodies comes first (the response; the other is a revisit) depends
    # on download order: compare the pages, and that each body is stored once.
    pages = clean.query("SELECT url, target_url, status, via, digest FROM archive_index ORDER BY 1, 5")
    bodies = clean.query(
        "SELECT digest, count(*) FILTER (WHERE record_type = 'response') FROM archive_index GROUP BY 1 ORDER BY 1"
    )
    return pages, bodies


def reprocess(env: dict, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    result = run_scrapy(env, "reprocess", "demo", *args, cwd=cwd)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return result


def test_reprocess_with_a_changed_cleaner_changes_only_affected_rows(clean, site, tmp_path) -> None:
    archive = str(tmp_path / "warc")
    crawl(clean, site, ARCHIVE_URL=archive)
    pages = clean.query("SELECT count(DISTINCT fingerprint) FROM archive_index")[0][0]
    assert pages == len(site.catalog.pages())
    assert clean.query("SELECT count(*) FROM archive_index WHERE record_type = 'revisit'")[0][0] > 0
    before = dict(clean.query("SELECT sku, title FROM products"))
    site.stop()
    served = site.stats()["total"]

    # Today's code: a cleaner that now writes "Kettle" as "Tea Kettle".
    project = project_with_text_cleaner(tmp_path, 'raw = raw.replace("Kettle", "Tea Kettle")')
    env = crawl_env(clean, ARCHIVE_URL=archive, PYTHONPATH=str(project))
    result = reprocess(env, "--since", "2000-01-01", cwd=project)
    assert f"reprocess: {pages}/{pages} pages" in result.stderr
    assert site.stats()["total"] == served  # not one request reached the site

    affected = {p.sku for p in site.catalog.valid_products() if "Kettle" in f"{p.title} {p.description} {p.brand}"}
    assert affected
    changes = clean.query("SELECT key, changes FROM item_changes WHERE reason = 'reprocess'")
    assert {key[1] for key, _ in changes} == affected
    assert all(set(c) <= {"title", "description", "brand"} for _, c in changes)
    after = dict(clean.query("SELECT sku, title FROM products"))
    assert {s for s in after if after[s] != before[s]} == {s for s in affected if "Kettle" in before[s]}

    # Replaying again changes nothing: no new history.
    reprocess(env, "--url", "*/p/*", cwd=project)
    assert clean.query("SELECT count(*) FROM item_changes WHERE reason = 'reprocess'")[0][0] == len(affected)


def test_s3_archive_equals_folder_archive_and_prune_keeps_30_days(clean, site, tmp_path, s3_server) -> None:
    endpoint, client = s3_server
    crawl(clean, site, ARCHIVE_URL=str(tmp_path / "warc"))
    folder_index = index_view(clean)
    folder_replay = reprocess(crawl_env(clean, ARCHIVE_URL=str(tmp_path / "warc")))

    clean.redis().flushdb()
    clean.query("TRUNCATE archive_index, item_changes, products, rejects")
    s3 = dict(S3_ENV, ARCHIVE_URL="s3://archive/warc", ARCHIVE_S3_ENDPOINT=endpoint, DATA_DIR=str(tmp_path / "data"))
    crawl(clean, site, **s3)
    assert index_view(clean) == folder_index
    s3_replay = reprocess(crawl_env(clean, **s3))
    summary = [line for line in s3_replay.stderr.splitlines() if line.startswith("reprocess: ") and "items" in line]
    expected = [
        line for line in folder_replay.stderr.splitlines() if line.startswith("reprocess: ") and "items" in line
    ]
    assert summary[0].split(", in ")[0] == expected[0].split(", in ")[0]
    assert "0 new, 0 updated" in summary[0]

    def objects() -> set[str]:
        return {o["Key"] for o in client.list_objects_v2(Bucket="archive").get("Contents", [])}

    files = objects()
    assert files and all(k.startswith("warc/demo/") and k.endswith(".warc.gz") for k in files)
    # Half the records 40 days old: pruned; the files stay, the kept half points into them.
    clean.query("UPDATE archive_index SET fetched_at = fetched_at - interval '40 days' WHERE id % 2 = 1")
    recent = clean.query("SELECT count(*) FROM archive_index WHERE id % 2 = 0")[0][0]
    pruned = run_scrapy(crawl_env(clean, **s3), "archive", "prune")
    assert pruned.returncode == 0, pruned.stderr[-2000:]
    assert clean.query("SELECT count(*) FROM archive_index WHERE id % 2 = 1")[0][0] == 0
    assert clean.query("SELECT count(*) FROM archive_index")[0][0] == recent > 0
    assert objects() == files
    assert "0 new, 0 updated" in reprocess(crawl_env(clean, **s3)).stderr  # every kept record still reads
    # A clock 31 days ahead: nothing is inside the window any more.
    later = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 31 * 86400))
    run_scrapy(crawl_env(clean, **s3), "archive", "prune", "--now", later)
    assert clean.query("SELECT count(*) FROM archive_index")[0][0] == 0
    assert objects() == set()


def test_no_key_cookie_or_authorization_reaches_the_archive(clean, site, tmp_path) -> None:
    key = "canary-" + os.urandom(8).hex()
    archive = tmp_path / "warc"
    with StandIn(key) as api:
        crawl(clean, site, ARCHIVE_URL=str(archive), SCRAPING_API_KEY=key, SCRAPING_API_URL=api.url)
    assert clean.query("SELECT count(*) FROM archive_index WHERE via = 'api' AND provider = 'alterlab'")[0][0] > 0
    files = list(archive.rglob("*.warc.gz"))
    assert files
    for path in files:
        data = gzip.decompress(path.read_bytes())
        assert b"WARC/1.0" in data
        assert key.encode() not in data
        for header in (b"\r\ncookie:", b"\r\nset-cookie:", b"\r\nauthorization:", b"\r\nx-api-key:"):
            assert header not in data.lower(), (path, header)
    # The archive's location is this test's folder, whose name holds "cookie": checked apart.
    dump = clean.query("SELECT string_agg((to_jsonb(a) - 'archive')::text, '') FROM archive_index a")[0][0]
    assert {row[0] for row in clean.query("SELECT DISTINCT archive FROM archive_index")} == {
        f"file://{socket.gethostname()}{archive}"
    }
    assert key not in dump and "cookie" not in dump.lower() and "authorization" not in dump.lower()


def test_a_bad_archive_setting_fails_at_start_naming_it(clean) -> None:
    result = run_scrapy(crawl_env(clean, ARCHIVE_RETENTION_DAYS="a month"), "crawl", "demo")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "ARCHIVE_RETENTION_DAYS" in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_reprocess_follow_queues_only_links_the_crawl_has_not_seen(clean, site, tmp_path) -> None:
    """A stopped crawl: its listing pages are archived, the products they link to are still in
    the shared queue. --follow queues none of those again (the crawl's seen-set has them), and,
    once that run is dropped, queues every link no page of the archive answers."""
    archive = str(tmp_path / "warc")
    stopped = run_scrapy(
        crawl_env(clean, DEMO_SITE_URL=site.url, ARCHIVE_URL=archive, CONCURRENT_REQUESTS="1"),
        "crawl",
        "demo",
        "-s",
        "CLOSESPIDER_PAGECOUNT=6",
    )
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    server = clean.redis()
    waiting = queue_depth(server, "{demo}:requests")
    assert waiting > 0
    env = crawl_env(clean, ARCHIVE_URL=archive)
    first = reprocess(env, "--follow")
    line = next(line for line in first.stderr.splitlines() if "new link(s) queued" in line)
    assert line.startswith("reprocess: 0 new link(s) queued") and "already seen by the crawl" in line, line
    assert queue_depth(server, "{demo}:requests") == waiting

    server.flushdb()  # the run and its seen-set gone: every unarchived link is new again
    second = reprocess(env, "--follow")
    line = next(line for line in second.stderr.splitlines() if "new link(s) queued" in line)
    queued = int(line.split("reprocess: ")[1].split(" ")[0])
    assert queued > 0 and queue_depth(server, "{demo}:requests") == queued, line


def test_reprocess_replays_the_archive_it_is_given_and_names_pages_held_elsewhere(clean, site, tmp_path) -> None:
    """One index, two archive folders (as after a change of ARCHIVE_URL, or two machines' local
    folders): each crawl's revisits point into its own archive only; a replay reads the archive
    it is given and says once, with the fix, which pages are elsewhere; a damaged file is named
    once and fails the command, without a traceback per page."""
    first, second, empty = (tmp_path / name for name in ("first", "second", "empty"))
    crawl(clean, site, ARCHIVE_URL=str(first))
    pages = clean.query("SELECT count(DISTINCT fingerprint) FROM archive_index")[0][0]
    clean.redis().flushdb()
    crawl(clean, site, ARCHIVE_URL=str(second))  # the same bodies again, into another folder

    def names(folder: Path) -> set[str]:
        return {str(p.relative_to(folder)) for p in folder.rglob("*.warc.gz")}

    for folder in (first, second):
        rows = clean.query(
            "SELECT file, payload_file FROM archive_index WHERE file = ANY(%s)", (sorted(names(folder)),)
        )
        assert len(rows) >= pages and {payload for _, payload in rows} <= names(folder)

    env = lambda folder: crawl_env(clean, ARCHIVE_URL=str(folder))  # noqa: E731
    latest = reprocess(env(second))
    assert f"reprocess: {pages}/{pages} pages" in latest.stderr and "does not hold" not in latest.stderr
    older = reprocess(env(first))
    note = [line for line in older.stderr.splitlines() if "does not hold" in line]
    assert len(note) == 1 and note[0].startswith(f"reprocess: {pages} page(s) of 'demo' have their latest"), note
    assert f"0 of them are skipped, {pages} replayed from an older version" in note[0]
    assert "ARCHIVE_URL" in note[0] and f"reprocess: {pages}/{pages} pages" in older.stderr

    empty.mkdir()
    none = run_scrapy(env(empty), "reprocess", "demo")
    assert none.returncode == 1 and "Traceback" not in none.stderr, none.stderr[-3000:]
    assert f"{pages} of them are skipped, 0 replayed" in none.stderr
    assert "reprocess: no archived pages of 'demo' match in this archive" in none.stderr

    damaged = sorted(names(second))[0]
    (second / damaged).write_bytes(b"not a WARC file")
    broken = run_scrapy(env(second), "reprocess", "demo")
    assert broken.returncode == 1 and "Traceback" not in broken.stderr, broken.stderr[-3000:]
    assert broken.stderr.count(f"cannot read {damaged} from the archive") == 1, broken.stderr[-3000:]
    assert "archived page(s) could not be read and were not replayed" in broken.stderr


def test_reprocess_replays_every_good_record_of_a_damaged_file_and_names_the_bad_ones(clean, site, tmp_path) -> None:
    folder = tmp_path / "archive"
    crawl(clean, site, ARCHIVE_URL=str(folder), ARCHIVE_FILE_SIZE="100000000")
    rows = clean.query(
        "SELECT file, record_offset, record_length, target_url FROM archive_index a "
        "WHERE record_type = 'response' AND NOT EXISTS (SELECT 1 FROM archive_index r WHERE "
        "r.record_type = 'revisit' AND r.payload_file = a.file AND r.payload_offset = a.record_offset) "
        "ORDER BY file, record_offset"
    )  # records no revisit reads its body from: one damaged record, one page skipped
    pages = clean.query("SELECT count(DISTINCT fingerprint) FROM archive_index")[0][0]
    # Two records in the middle of a file overwritten, as a bad sector or a torn copy would.
    by_file: dict[str, list] = {}
    for row in rows:
        by_file.setdefault(row[0], []).append(row)
    name, records = max(by_file.items(), key=lambda kv: len(kv[1]))
    assert len(records) >= 6, len(records)
    bad = [records[2], records[len(records) // 2]]
    with open(folder / name, "r+b") as f:
        for _, offset, length, _url in bad:
            f.seek(offset)
            f.write(b"\0" * length)
    result = run_scrapy(crawl_env(clean, ARCHIVE_URL=str(folder)), "reprocess", "demo")
    log = result.stderr
    assert result.returncode == 1 and "Traceback" not in log, log[-3000:]
    assert f"reprocess: {pages - 2}/{pages} pages" in log, log[-3000:]
    for _, offset, length, url in bad:
        assert f"skipped {url}: its record at {name} bytes {offset}-{offset + length} cannot be read" in log, log[
            -3000:
        ]
    assert "reprocess: 2 archived page(s) could not be read and were not replayed" in log


def _tmpfs(mount: Path, options: str):
    """A tmpfs mounted at *mount* with *options* for the test's length."""
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs: the archive's disk fills mid-crawl, as a real full disk does (ENOSPC)."""
    yield from _tmpfs(tmp_path / "small-disk", "size=64k")


def test_a_full_archive_disk_stops_archiving_loudly_and_never_hangs_shutdown(clean, site, small_disk) -> None:
    started = time.monotonic()
    result = run_scrapy(
        crawl_env(clean, DEMO_SITE_URL=site.url, ARCHIVE_URL=str(small_disk)), "crawl", "demo", timeout=60
    )
    assert time.monotonic() - started < 60
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.count("Archive stopped:") == 1, result.stderr[-3000:]
    assert "No space left on device" in result.stderr
    assert "flush of closed file" not in result.stderr
    from support.crawls import assert_each_product_stored_or_rejected_once

    assert_each_product_stored_or_rejected_once(clean.query, site.catalog)  # the crawl itself lost nothing
    not_archived = int(result.stderr.split("'archive/not_archived': ")[1].split(",")[0].split("}")[0])
    archived = clean.query("SELECT count(DISTINCT fingerprint) FROM archive_index")[0][0]
    assert not_archived > 0 and archived >= 0  # a fast crawl may fill the disk before the first index write
    # The index names only whole records on disk: each one reads back as a complete gzip member.
    for name, offset, length in clean.query(
        "SELECT file, record_offset, record_length FROM archive_index WHERE record_type = 'response'"
    ):
        path = small_disk / name
        assert offset + length <= path.stat().st_size, (name, offset, length)
        with open(path, "rb") as f:
            f.seek(offset)
            assert gzip.decompress(f.read(length)).startswith(b"WARC/")


def test_archive_required_stops_the_crawl_and_acknowledges_no_page_it_did_not_archive(
    clean, site, small_disk, tmp_path
) -> None:
    env = crawl_env(
        clean, DEMO_SITE_URL=site.url, ARCHIVE_URL=str(small_disk), ARCHIVE_REQUIRED="true", SCHEDULER_LEASE_TIMEOUT="3"
    )
    started = time.monotonic()
    stopped = run_scrapy(env, "crawl", "demo", timeout=60)
    assert time.monotonic() - started < 60
    log = stopped.stderr
    assert stopped.returncode == 5, log[-3000:]  # stopped, not finished
    assert "Traceback" not in log, log[-3000:]
    assert "Spider closed (archive_failed)" in log and log.count("ARCHIVE_REQUIRED: the archive failed") == 1, log[
        -3000:
    ]
    assert "'scheduler/abandoned': " in log, log[-3000:]
    fetched = clean.query("SELECT count(*) FROM products")[0][0]
    assert fetched < len(site.catalog.valid_products()), fetched  # it stopped early

    # The disk replaced by a good one: the next run resumes, the pages that were not archived
    # come back (their leases ran out), and every page the spider saw is in the archive.
    roomy = tmp_path / "archive"
    again = run_scrapy(
        crawl_env(
            clean, DEMO_SITE_URL=site.url, ARCHIVE_URL=str(roomy), ARCHIVE_REQUIRED="true", SCHEDULER_LEASE_TIMEOUT="3"
        ),
        "crawl",
        "demo",
        timeout=120,
    )
    assert again.returncode == 0 and "Spider closed (finished)" in again.stderr, again.stderr[-3000:]
    from support.crawls import assert_each_product_stored_or_rejected_once

    assert_each_product_stored_or_rejected_once(clean.query, site.catalog)
    product_pages = {f"{site.origin}{path}" for path in site.catalog.pages() if "/p/" in path}
    assert len(product_pages) > 100
    archived = {url for (url,) in clean.query("SELECT DISTINCT target_url FROM archive_index")}
    missing = product_pages - archived
    assert not missing, sorted(missing)[:5]
    # Each archived record is whole on disk, on whichever disk it went to.
    for name, offset, length, where in clean.query(
        "SELECT file, record_offset, record_length, archive FROM archive_index WHERE record_type = 'response'"
    ):
        path = (roomy if where.endswith(str(roomy)) else small_disk) / name
        with open(path, "rb") as f:
            f.seek(offset)
            assert gzip.decompress(f.read(length)).startswith(b"WARC/")


@pytest.fixture
def read_only_folder(tmp_path):
    """A read-only file system (a tmpfs mounted ro): as root, a chmod would not stop a write."""
    yield from _tmpfs(tmp_path / "read-only", "ro,size=64k")


def test_a_read_only_archive_folder_stops_archiving_loudly_and_the_crawl_goes_on(clean, site, read_only_folder) -> None:
    result = run_scrapy(
        crawl_env(clean, DEMO_SITE_URL=site.url, ARCHIVE_URL=str(read_only_folder)), "crawl", "demo", timeout=60
    )
    log = result.stderr
    assert result.returncode == 0 and "Traceback" not in log, log[-3000:]
    assert log.count("Archive stopped:") == 1 and "Read-only file system" in log, log[-3000:]
    from support.crawls import assert_each_product_stored_or_rejected_once

    assert_each_product_stored_or_rejected_once(clean.query, site.catalog)
    pages = int(re.search(r"'response_received_count': (\d+)", log).group(1))
    robots = int(re.search(r"'robotstxt/response_count': (\d+)", log).group(1))
    not_archived = int(re.search(r"'archive/not_archived': (\d+)", log).group(1))
    assert not_archived == pages - robots, (not_archived, pages, robots)  # every page, counted
    runs = run_scrapy(crawl_env(clean), "runs", "demo", "--json")
    assert json.loads(runs.stdout.splitlines()[0])["not_archived"] == not_archived


def test_a_bucket_that_stops_answering_stops_archiving_loudly_and_never_hangs(clean, tmp_path, s3_server) -> None:
    endpoint, client = s3_server
    from scraper.demo_site import Catalog, DemoSite

    with DemoSite(Catalog(products=150), delay_ms=30) as site:
        env = crawl_env(
            clean,
            DEMO_SITE_URL=site.url,
            ARCHIVE_URL="s3://archive/warc",
            ARCHIVE_S3_ENDPOINT=endpoint,
            DATA_DIR=str(tmp_path / "data"),
            ARCHIVE_FILE_SIZE="1024",
            CONCURRENT_REQUESTS="2",
            **S3_ENV,
        )
        from support.processes import start_crawl, wait_for

        started = time.monotonic()
        worker = start_crawl(env)
        wait_for(lambda: len(client.list_objects_v2(Bucket="archive").get("Contents", [])) >= 5, timeout=60)
        s3_server_stop(endpoint)  # the bucket's server goes away mid-crawl
        _out, log = worker.communicate(timeout=180)
        took = time.monotonic() - started
        assert worker.returncode == 0 and "Traceback" not in log, log[-3000:]
        assert log.count("Archive stopped:") == 1, log[-3000:]
        assert int(re.search(r"'archive/not_archived': (\d+)", log).group(1)) > 0, log[-3000:]
        assert took < 150, took
        from support.crawls import assert_each_product_stored_or_rejected_once

        assert_each_product_stored_or_rejected_once(clean.query, site.catalog)
