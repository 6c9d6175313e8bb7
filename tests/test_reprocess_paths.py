"""The fast replay stores exactly what the engine replay stores: the same archive, replayed from
the same stored state through today's (changed) code by ``scrapy reprocess --engine`` (Scrapy's
scheduler and downloader, one process), by the direct replay in one process and by the direct
replay split over two worker processes, leaves the same rows, history, rejects, field counts
and Redis records."""

from __future__ import annotations

from types import SimpleNamespace

from support.crawls import crawl, crawl_env, project_with_text_cleaner, run_scrapy

from scraper.archive.reader import MAX_GAP, _stretches, load_batch
from scraper.archive.workers import merge_stats, shares, worker_count

# What a replay writes, less what differs between any two runs of the same work (times, serial ids).
STATE = {
    "products": "SELECT source, sku, title, price, price_high, currency, url, brand, description, category,"
    " availability, image, released_at, content_hash, gone_at, spider FROM products ORDER BY source, sku",
    "history": "SELECT item_table, key, kind, reason, spider, run_id, changes FROM item_changes"
    " ORDER BY item_table, key::text, kind, reason, changes::text",
    "rejects": "SELECT id, spider, item_type, url, reasons, item, times_seen FROM rejects ORDER BY id",
    "field_sources": "SELECT spider, run_id, item_type, field, selector, items FROM field_sources ORDER BY 1, 2, 3, 4, 5",
    "held": "SELECT spider, run_id, item_table, key, kind, reasons, changes FROM held_changes ORDER BY 1, 2, 3, 4::text, 5",
}
TABLES = ("products", "item_changes", "rejects", "field_sources", "held_changes")


def _snapshot(clean) -> None:
    for table in TABLES:
        clean.query(f"CREATE TABLE IF NOT EXISTS {table}_before AS SELECT * FROM {table}")


def _restore(clean) -> None:
    for table in TABLES:
        clean.query(f"DELETE FROM {table}")
        clean.query(f"INSERT INTO {table} SELECT * FROM {table}_before")


def _redis_state(clean) -> dict[bytes, object]:
    server = clean.redis()
    found = {}
    for key in sorted(server.keys("{demo}:*")):
        kind = server.type(key)
        if kind == b"hash":
            found[key] = server.hgetall(key)
        elif kind == b"set":
            found[key] = server.smembers(key)
    return found


def test_the_direct_replay_in_one_and_in_two_processes_stores_what_the_engine_replay_stores(
    clean, site, tmp_path
) -> None:
    archive = str(tmp_path / "warc")
    crawl(clean, site, ARCHIVE_URL=archive)
    pages = clean.query("SELECT count(DISTINCT fingerprint) FROM archive_index")[0][0]
    site.stop()
    served = site.stats()["total"]

    # Today's code extracts differently: rows change, and their history says "reprocess".
    project = project_with_text_cleaner(tmp_path, 'raw = raw.replace("e", "E")')
    env = crawl_env(clean, ARCHIVE_URL=archive, PYTHONPATH=str(project))
    _snapshot(clean)
    redis_before = _redis_state(clean)

    outcomes = {}
    for name, args in (("engine", ["--engine"]), ("direct", ["--workers", "1"]), ("two workers", ["--workers", "2"])):
        _restore(clean)
        result = run_scrapy(env, "reprocess", "demo", *args, cwd=project)
        assert result.returncode == 0 and "Traceback" not in result.stderr, (name, result.stderr[-3000:])
        assert f"reprocess: {pages}/{pages} pages" in result.stderr, (name, result.stderr[-3000:])
        if name == "two workers":
            assert "in 2 processes" in result.stderr, result.stderr[-3000:]
        summary = [line for line in result.stderr.splitlines() if line.startswith("reprocess: ") and "items" in line]
        outcomes[name] = (
            {part: clean.query(sql) for part, sql in STATE.items()},
            summary[-1].split(", in ")[0],
            _redis_state(clean),
        )
    assert site.stats()["total"] == served  # not one request reached the site

    engine, engine_summary, engine_redis = outcomes["engine"]
    assert engine["history"] and {row[3] for row in engine["history"]} == {"crawl", "reprocess"}
    assert engine["rejects"] and engine["field_sources"]
    assert engine_redis == redis_before  # the replay's own claims are dropped; the page records stay
    for name in ("direct", "two workers"):
        state, summary, redis_after = outcomes[name]
        for part in STATE:
            assert state[part] == engine[part], (name, part)
        assert summary == engine_summary, name
        assert redis_after == engine_redis, name


def test_two_workers_say_what_one_process_says_of_unreadable_records_and_links_found(clean, site, tmp_path) -> None:
    folder = tmp_path / "archive"
    crawl(clean, site, ARCHIVE_URL=str(folder))
    pages = clean.query("SELECT count(DISTINCT fingerprint) FROM archive_index")[0][0]
    env = crawl_env(clean, ARCHIVE_URL=str(folder))

    def links(*args: str) -> str:
        result = run_scrapy(env, "reprocess", "demo", "--follow", *args)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
        return next(line for line in result.stderr.splitlines() if "new link(s) queued" in line)

    # Every link leads to an archived page: none queued, each counted once however many found it.
    assert links("--workers", "2") == links("--engine")

    rows = clean.query(
        "SELECT file, record_offset, record_length, url FROM archive_index a WHERE record_type = 'response'"
        " AND NOT EXISTS (SELECT 1 FROM archive_index r WHERE r.record_type = 'revisit'"
        " AND r.payload_file = a.file AND r.payload_offset = a.record_offset) ORDER BY file, record_offset"
    )
    name = rows[0][0]
    bad = [r for r in rows if r[0] == name][2:4]  # neighbours: one worker each
    with open(folder / name, "r+b") as f:
        for _, offset, length, _url in bad:
            f.seek(offset)
            f.write(b"\0" * length)
    result = run_scrapy(env, "reprocess", "demo", "--workers", "2")
    log = result.stderr
    assert result.returncode == 1 and "Traceback" not in log, log[-3000:]
    assert "in 2 processes" in log and f"reprocess: {pages - 2}/{pages} pages" in log, log[-3000:]
    assert log.count(f"cannot read {name} from the archive") == 1, log[-3000:]
    for _, offset, length, url in bad:
        assert f"skipped {url}: its record at {name} bytes {offset}-{offset + length} cannot be read" in log
    assert "reprocess: 2 archived page(s) could not be read and were not replayed" in log


class _Store:
    """Bytes by file name; a read past a file's end comes back short, as from a cut file."""

    def __init__(self, files: dict[str, bytes], broken: set[str] = frozenset()) -> None:
        self.files, self.broken, self.reads = files, broken, []

    def read(self, name: str, offset: int, length: int) -> bytes:
        self.reads.append((name, offset, length))
        if name in self.broken:
            raise FileNotFoundError(name)
        return self.files[name][offset : offset + length]


def _record(file: str, offset: int, length: int, payload: tuple[str, int, int] | None = None) -> SimpleNamespace:
    payload_file, payload_offset, payload_length = payload or (file, offset, length)
    return SimpleNamespace(
        file=file,
        record_offset=offset,
        record_length=length,
        payload_file=payload_file,
        payload_offset=payload_offset,
        payload_length=payload_length,
    )


def test_a_batch_reads_each_stretch_once_and_a_record_it_cannot_cut_out_alone() -> None:
    data = {"a": bytes(range(100)), "b": b"x" * 10}
    store = _Store(data)
    records = [_record("a", 0, 10), _record("a", 10, 10), _record("a", 90, 20), _record("b", 0, 5, ("a", 50, 5))]
    parse = lambda reader, r: reader.read(r.file, r.record_offset, r.record_length)  # noqa: E731
    out = load_batch(store, records, parse)
    # What each record reads alone, byte for byte; the cut file's last record reads short, as alone.
    assert out == [data["a"][0:10], data["a"][10:20], data["a"][90:110], data["b"][0:5]]
    assert ("a", 0, 110) in store.reads and ("a", 90, 20) in store.reads and len(store.reads) == 3
    assert _stretches([("a", 0, 10), ("a", 10 + MAX_GAP + 1, 20)]) == [("a", 0, 10), ("a", 10 + MAX_GAP + 1, 20)]

    def fails(reader, r):
        raise ValueError("no WARC record at this offset")

    broken = load_batch(_Store(data, {"a"}), records[:2], fails)
    assert all(isinstance(x, ValueError) for x in broken)  # per record, as a replay alone reports them


def test_workers_take_every_nth_record_and_only_with_enough_pages() -> None:
    assert shares(list(range(7)), 2) == [[0, 2, 4, 6], [1, 3, 5]]
    assert worker_count(None, 999) == 1
    assert worker_count(3, 2) == 2 and worker_count(1, 10_000) == 1
    stats = merge_stats([{"item_scraped_count": 2, "memusage/max": 5}, {"item_scraped_count": 3, "memusage/max": 7}])
    assert stats == {"item_scraped_count": 5, "memusage/max": 7}
