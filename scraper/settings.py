"""Project settings. Everything a deployment changes comes from the environment, here and only here.

Environment variables (all optional; the defaults run the embedded, single-machine setup):

==========================  ==================================================================
``REDIS_URL``               Shared queue and dupefilter, e.g. ``redis://:password@host:6379/0``.
                            Unset: an embedded Redis under ``DATA_DIR``.
``DATABASE_URL``            Postgres, e.g. ``postgresql://user:password@host:5432/db``.
                            Unset: an embedded Postgres under ``DATA_DIR``.
``DATA_DIR``                Where embedded servers keep their data (``.data``), relative to the
                            project root (the folder of ``scrapy.cfg``).
``DEMO_SITE_URL``           Start URL of the ``demo`` spider (``http://127.0.0.1:8765/``).
``CONCURRENT_REQUESTS``     Scrapy's global concurrency (32).
``CONCURRENT_REQUESTS_PER_DOMAIN``  Per-site concurrency (16).
``DOWNLOAD_DELAY``          Seconds between requests to one site (0).
``DOWNLOAD_POOL_PER_HOST``  Idle connections kept open per host (2 x ``CONCURRENT_REQUESTS_PER_DOMAIN``).
``GC_YOUNG_THRESHOLD``      Allocations between two young-generation collections while a crawl
                            runs (20000; 0: CPython's 700). ``GC_FREEZE=false`` leaves the
                            collector as CPython sets it.
``THREAD_SWITCH_INTERVAL``  Seconds after which a worker thread (the Postgres writer, the Redis
                            batcher) gets the interpreter back from a busy crawl (0.0005; 0:
                            CPython's 0.005).
``POLITENESS_RATE``         Requests per second to one site from the whole fleet together
                            (0: no limit); held in Redis, shared by every node and spider.
``POLITENESS_CONCURRENCY``  Requests in flight to one site from the whole fleet (0: no limit).
``POLITENESS_OVERRIDES``    Per-domain limits, e.g.
                            ``shop.test=rate:2/concurrency:4,slow.test=rate:0.5``; an entry
                            for ``example.com`` covers its subdomains, which share its budget.
``POLITENESS_MAX_WAIT``     Seconds ahead the fleet may book a site's turns (60); further
                            requests wait for room, and the site is logged once as saturated.
``POLITENESS_ADAPTIVE``     A site that answers 429/503 gets a fleet-wide rate, cut on each
                            throttle and raised on success (true).
``POLITENESS_ADAPTIVE_DECREASE``  The share of its rate a throttling site keeps (0.7).
``POLITENESS_ADAPTIVE_INCREASE``  Requests/s the rate gains per second of success (1.0).
``POLITENESS_BLOCK_PATTERN``  A 403 whose body matches this regex (a bot wall's challenge) is a
                            throttle answer like a 429 (default: common captcha markers; ``off``).
``POLITENESS_ADAPTIVE_MIN_RATE``  The lowest adaptive rate, requests/s (0.1).
``POLITENESS_THROTTLED_MAX_WAIT``  Seconds a throttled request keeps trying before it becomes a
                            ``throttled`` dead letter (600).
``SCHEDULER_IDLE_TIMEOUT``  Seconds the shared queue must stay empty before a spider stops (10).
``SCHEDULER_PREFETCH``      Requests taken from the shared queue per round trip (4).
``SCHEDULER_LEASE_TIMEOUT`` Seconds a taken request stays leased without renewal before another
                            worker gets it again (60); 0 turns at-least-once delivery off.
``SCHEDULER_MAX_LEASES``    Leases one node holds at most (2 x ``CONCURRENT_REQUESTS``; 0: no
                            cap): at the cap it takes no more and has its pending rows
                            committed now, so a killed node costs at most that many refetches.
``SCHEDULER_SHARDS``        Shards of one spider's frontier (queue, leases, seen-set), by the
                            domain of each request, each under its own Redis Cluster hash tag
                            so that one crawl spreads over every master (1: unsharded). Fixed
                            for a run: a stopped run resumes with the count it started with.
``RUNS_NODE_TTL``           Seconds without a heartbeat after which a node of another host
                            counts as gone (60); a node of this host whose process is gone
                            counts as gone at once. A run with no node left, nothing queued
                            and nothing leased is finished.
``RUNS_CLOCK_SKEW_WARN``   A node whose clock is off from Redis' by more than this many seconds
                            says so at start (30); leases and heartbeats use Redis' clock anyway.
``RUNS_REPORT_INTERVAL``    Seconds between a node's reports of its figures to the run (5).
``RUNS_FRESH``              Discard a stopped run instead of resuming it (false); what
                            ``scrapy crawl --fresh`` sets.
``DUPEFILTER_BACKEND``      Where the seen requests are kept: ``set`` (exact, ~90 bytes per URL)
                            or ``bloom`` (a Bloom filter, ~1.8 bytes per URL at 0.1%).
``DUPEFILTER_BLOOM_CAPACITY``  URLs the Bloom filter is sized for (10000000: 18 MB at 0.1%).
``DUPEFILTER_BLOOM_ERROR_RATE``  Its false-positive rate at capacity (0.001): new pages skipped.
``DUPEFILTER_EXPIRY``       Seconds after which a seen request is forgotten, so its page is
                            crawled again (0: never); forgotten between half of it and all of it.
``POSTGRES_BATCH_SIZE``     Rows per upsert batch (1000).
``POSTGRES_FLUSH_INTERVAL`` Seconds before a partial batch is written anyway (1.0).
``POSTGRES_LAST_SEEN_RESOLUTION``  Refresh ``last_seen`` of unchanged rows at most this often,
                            in seconds (3600); 0 refreshes it on every sighting (one write per row).
``POSTGRES_MAX_PENDING``    Rows waiting for the database before new downloads are held (10000).
``POSTGRES_RETRY_TIMEOUT``  Seconds to keep retrying an unreachable database (600); then the
                            unstored pages become dead letters and the spider stops.
``POSTGRES_STALL_WARN_SECONDS`` While a batch has not committed for this long (a lock, a slow
                            disk), warn every this many seconds with the rows waiting and what
                            Postgres says the writer waits on (30; 0: never).
``METRICS_ENABLED``         Serve Prometheus metrics from each crawl process (true).
``METRICS_BIND``            Address of the metrics endpoint (127.0.0.1).
``METRICS_PORT``            First port tried for it (9410); ``METRICS_PORT_RANGE`` ports are tried (50).
``METRICS_FILE_SD_DIR``     Where each crawl process announces its endpoint to Prometheus (file_sd),
                            default ``DATA_DIR/metrics-targets``; files of processes that are
                            gone are removed by the next process on the host.
``METRICS_ANNOUNCE``        Write that target file (false; ``scrapy crawl`` and scrapyd jobs
                            set it: other commands announce nothing).
``METRICS_LINGER``          Seconds to keep serving after the spider closed (0).
``SCRAPING_API_KEY``        Key of the scraping API; unset, pages are fetched directly. Never logged.
``SCRAPING_API_URL``        Base URL of the scraping API; unset, the provider's own.
``SCRAPING_API_PROVIDER``   alterlab (default), scrapingbee or zyte.
``SCRAPING_API_BUDGET``     What one crawl process may spend, in the provider's billing unit
                            (AlterLab: microcents, 1,000,000 = $1; ScrapingBee: credits; Zyte:
                            requests); 0: no budget.
``SCRAPING_API_ROUTING``    Per-domain route, e.g. ``shop.test=on_block,cdn.test=never``;
                            ``SCRAPING_API_DEFAULT_ROUTE`` for the rest (always).
``SCRAPING_API_OPTIONS``    JSON options for the API (``{"render_js": true}``); a spider's
                            ``scraping_api`` dict and ``request.meta["scraping_api"]`` override.
                            An option the provider does not document fails at start.
``SCRAPING_API_BLOCKED_RETRIES``  Retries of a page the API reports blocked by the target (2),
                            each with the next step of ``SCRAPING_API_BLOCKED_ESCALATION``
                            (JSON list of options, default ``[{"render_js": true}]``); then the
                            page is a dead letter. A block never stops the crawl.
``SCRAPING_API_ROBOTSTXT``  ``direct`` (default: robots.txt is fetched without the API) or ``api``.
``DATE_LANGUAGES``          Languages dates are read in, e.g. ``de,en`` (a spider's ``date_languages``
                            wins); unset: the page's declared language (``Content-Language``,
                            ``<html lang>``) then English, else English alone.
``CLEAN_LOCALE``            The locale (``de-CH``) numbers and numeric dates are read by when
                            neither the request's meta ``locale``, the spider's ``locale`` nor the
                            page declares one; unset: guessed shapes only (see docs/guides/cleaning.md).
``DLQ_CALLBACK_RETRIES``    More tries for a request whose callback raised, before it becomes
                            a dead letter (1); see ``scrapy dlq``.
``ARCHIVE_ENABLED``         Archive every response the spiders see as WARC (false); setting
                            ``ARCHIVE_URL`` turns it on too.
``ARCHIVE_URL``             Where: a folder (default ``DATA_DIR/archive``) or
                            ``s3://bucket/prefix`` (credentials from the usual ``AWS_*`` variables).
``ARCHIVE_S3_ENDPOINT``     URL of an S3-compatible server (MinIO, Ceph…); unset: AWS.
``ARCHIVE_RETENTION_DAYS``  Days ``scrapy archive prune`` keeps (30); a file a kept revisit
                            record points at is kept too.
``ARCHIVE_FILE_SIZE``       Bytes before the archive starts a new file (104857600).
``ARCHIVE_FILE_AGE``        Seconds before the archive starts a new file (300).
``ARCHIVE_REQUIRED``        A page goes on only once its record is on disk; when the archive
                            fails, its pages are not acknowledged and the crawl stops (false).
``PROCESSING``              ``inline`` (default: each crawl node runs the callbacks) or ``decoupled``:
                            crawl nodes fetch and hand each response to a Redis Stream, and
                            ``scrapy process SPIDER`` workers run the callbacks and pipelines.
``PROCESSING_MAX_PENDING``  Responses the stream may hold before fetchers hold new downloads (1000).
``PROCESSING_CLAIM_IDLE``   Seconds a processor may hold an entry unrenewed (it died) before
                            another takes it over (60).
``PROCESSING_MAX_DELIVERIES``  Deliveries of one entry before it becomes a dead letter (3).
``PROCESSING_BATCH``        Entries a processor reads per round trip (16).
``QUALITY_ENABLED``         Check each finished run's data quality (true); see docs/operations/data-quality.md.
``QUALITY_BASELINE_RUNS``   A finished run is compared with the spider's last N checked runs (5).
``QUALITY_MIN_ITEMS``       Fewer stored items of a type (or prices seen before): their coverage
                            (price pairs) is not judged (10).
``QUALITY_COVERAGE_TOLERANCE``  A field with no declared expectation fails below its average
                            coverage over the baseline less this (0.1).
``QUALITY_ITEMS_DROP``      Items stored may drop by this share of the baseline's median (0.2).
``QUALITY_REJECTS_RISE``    A field's share of rejected items may rise by this much (0.05).
``QUALITY_GONE_SPIKE``      Rows gone in one run, as a share of the baseline's items (0.1).
``QUALITY_PAGES_PER_ITEM_RISE``  Pages per stored item may rise by this share (0.5).
``QUALITY_RESPONSES_RISE``  The share of error, blocked or empty responses may rise by this (0.05).
``QUALITY_PRICE_SHIFT``     A price that moved by more than this share run over run jumped (0.25).
``QUALITY_PRICE_JUMPS``     At most this share of an item type's prices seen before may jump (0.1).
``QUALITY_DEAD_LETTERS``    At most this share of a run's pages may end as dead letters (0.05).
``QUALITY_FAIL_EXIT``       ``scrapy crawl`` exits with status 3 when its run is degraded (true;
                            0 keeps exit 0 for schedulers that must not see it).
``QUALITY_ON_BREAK``        What a run does when the live guard sees a field's coverage break
                            or its rejects spike: ``hold`` (default: items without the field
                            are held with the run, nothing is marked gone; see ``scrapy runs
                            --report/--apply/--discard``), ``stop`` (close the spider),
                            ``continue``.
``QUALITY_GUARD_POLL``      Seconds between two looks of each node at the fleet's break and at
                            the rejects (2).
``QUALITY_GUARD_WINDOW``    The live guard judges the last this many items of a type (200).
``LOG_LEVEL``               Scrapy's log level (INFO).
``PSQL``                    The psql ``scrapy dbshell`` runs (default: the one bundled with the
                            embedded Postgres for it, else the system's).
==========================  ==================================================================

Not from the environment: ``SHARED_STATE`` (a ``-s`` option) says whether a process is a crawl
node, using the shared queue, seen-set, dedupe claims, politeness slots, node registry, metrics
target folder and database. ``scrapy crawl`` (so every scrapyd job) and ``scrapy demo`` set it;
every other command (``shell``, ``fetch``, ``view``, ``parse``, ``check``, ``runspider``, a
script) runs with Scrapy's in-memory scheduler and touches none of them unless given
``-s SHARED_STATE=true``. See :mod:`scraper.shared_state`.

Passwords in the URLs never reach the logs: see :mod:`scraper.secrets`.
"""

import os

BOT_NAME = "scraper"

SPIDER_MODULES = ["scraper.spiders"]
NEWSPIDER_MODULE = "scraper.spiders"
COMMANDS_MODULE = "scraper.commands"
TEMPLATES_DIR = os.path.join(os.path.dirname(__file__), "templates")


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


# --- backends -------------------------------------------------------------------------------
REDIS_URL = _env("REDIS_URL", "")
DATABASE_URL = _env("DATABASE_URL", "")
DATA_DIR = _env("DATA_DIR", ".data")

# Resolves the URLs above (or starts the embedded servers) before any component is built.
ADDONS = {
    "scraper.addon.BackendsAddon": 0,
    "scraper.scraping_api.addon.ScrapingApiAddon": 10,
    "scraper.archive.addon.ArchiveAddon": 20,
}

# --- crawling -------------------------------------------------------------------------------
ROBOTSTXT_OBEY = True
USER_AGENT = _env("USER_AGENT", "scraper (+https://example.invalid/bot)")
CONCURRENT_REQUESTS = _env("CONCURRENT_REQUESTS", "32")
CONCURRENT_REQUESTS_PER_DOMAIN = _env("CONCURRENT_REQUESTS_PER_DOMAIN", "16")
DOWNLOAD_DELAY = _env("DOWNLOAD_DELAY", "0")
DOWNLOAD_TIMEOUT = _env("DOWNLOAD_TIMEOUT", "60")
# Numbers stay strings here: the add-on validates them at start and names a bad one.
# Bound what one response may cost in memory (applies after decompression).
DOWNLOAD_MAXSIZE = _env("DOWNLOAD_MAXSIZE", str(32 * 1024 * 1024))
DOWNLOAD_WARNSIZE = _env("DOWNLOAD_WARNSIZE", str(8 * 1024 * 1024))
# Idle connections kept per host (scraper/downloader/http.py); unset: 2 x CONCURRENT_REQUESTS_PER_DOMAIN.
if _env("DOWNLOAD_POOL_PER_HOST") is not None:
    DOWNLOAD_POOL_PER_HOST = _env("DOWNLOAD_POOL_PER_HOST")
DOWNLOAD_HANDLERS = {
    "http": "scraper.downloader.http.PooledHTTPDownloadHandler",
    "https": "scraper.downloader.http.PooledHTTPDownloadHandler",
    # A crawl node fetches the web, nothing else: a queue entry must not read local files or
    # reach buckets and FTP servers with the node's credentials (see docs/operations/security.md).
    "file": None,
    "s3": None,
    "ftp": None,
    "data": None,
}
# Networks a crawl node may fetch from although they are not public (CIDR, comma-separated):
# loopback, private, link-local and metadata addresses are refused otherwise
# (scraper/middlewares/fetch_boundary.py). The demo and the tests allow 127.0.0.0/8; empty with the
# embedded Redis, loopback is allowed (a queue only this machine writes to).
FETCH_ALLOW_NETWORKS = _env("FETCH_ALLOW_NETWORKS", "")
# The fleet secret every queue entry is signed with (scraper/queue/signing.py): required with a
# shared Redis (REDIS_URL), made once under DATA_DIR for the embedded one. The previous value is
# accepted for verification during a rotation.
SCHEDULER_SECRET = _env("SCHEDULER_SECRET", "")
SCHEDULER_SECRET_PREVIOUS = _env("SCHEDULER_SECRET_PREVIOUS", "")
# Fleet-wide per-domain limits (scraper/politeness): declared ones, and the adaptive rate of a
# site that throttles (429/503), on by default.
POLITENESS_RATE = _env("POLITENESS_RATE", "0")
POLITENESS_CONCURRENCY = _env("POLITENESS_CONCURRENCY", "0")
POLITENESS_OVERRIDES = _env("POLITENESS_OVERRIDES", "")
POLITENESS_MAX_WAIT = _env("POLITENESS_MAX_WAIT", "60")
POLITENESS_ADAPTIVE = _env("POLITENESS_ADAPTIVE", "true")
POLITENESS_ADAPTIVE_DECREASE = _env("POLITENESS_ADAPTIVE_DECREASE", "0.7")
POLITENESS_ADAPTIVE_INCREASE = _env("POLITENESS_ADAPTIVE_INCREASE", "1.0")
POLITENESS_ADAPTIVE_MIN_RATE = _env("POLITENESS_ADAPTIVE_MIN_RATE", "0.1")
# A 403 whose body matches is a throttle answer (a bot wall's challenge); off: 403s never are.
POLITENESS_BLOCK_PATTERN = _env("POLITENESS_BLOCK_PATTERN")  # unset: common captcha markers
POLITENESS_THROTTLED_MAX_WAIT = _env("POLITENESS_THROTTLED_MAX_WAIT", "600")
# Measured: fewer items in flight per response keeps the reactor responsive at no cost.
CONCURRENT_ITEMS = 16
LOG_LEVEL = _env("LOG_LEVEL", "INFO")
DEMO_SITE_URL = _env("DEMO_SITE_URL", "http://127.0.0.1:8765/")

# Both execute code sent to them over a socket; nothing in production should.
TELNETCONSOLE_ENABLED = False
REMOTE_CONTROL_ENABLED = False

# --- shared queue (scrapy-redis) --------------------------------------------------------------
SCHEDULER = "scraper.queue.scheduler.SharedScheduler"
SCHEDULER_QUEUE_CLASS = "scraper.queue.queues.PriorityQueue"
SCHEDULER_SERIALIZER = "scraper.queue.serializer"
SCHEDULER_IDLE_TIMEOUT = _env("SCHEDULER_IDLE_TIMEOUT", "10")
# Fingerprints this process remembers before asking Redis (~100 bytes each; cleared when full).
SCHEDULER_DUPEFILTER_LOCAL_CACHE = _env("SCHEDULER_DUPEFILTER_LOCAL_CACHE", "20000")
# Requests taken from the shared queue per round trip (leased like the rest).
SCHEDULER_PREFETCH = _env("SCHEDULER_PREFETCH", "4")
# At-least-once delivery: a taken request is leased for this many seconds, renewed while its
# worker lives, and put back in the queue if the worker dies (0 turns leases off).
SCHEDULER_LEASE_TIMEOUT = _env("SCHEDULER_LEASE_TIMEOUT", "60")
# A request redelivered this many times (its workers keep dying) becomes a dead letter.
SCHEDULER_MAX_REDELIVERIES = _env("SCHEDULER_MAX_REDELIVERIES", "5")
# Shards of one spider's frontier, by domain, each under its own hash tag (1: unsharded).
SCHEDULER_SHARDS = _env("SCHEDULER_SHARDS", "1")
if _env("SCHEDULER_MAX_LEASES") is not None:  # unset: twice CONCURRENT_REQUESTS, however that is set
    SCHEDULER_MAX_LEASES = _env("SCHEDULER_MAX_LEASES")
DUPEFILTER_CLASS = "scraper.queue.dupefilter.SharedDupeFilter"
# Runs (scraper/runs): a node of another host that stays silent this long is gone.
RUNS_NODE_TTL = _env("RUNS_NODE_TTL", "60")
RUNS_CLOCK_SKEW_WARN = _env("RUNS_CLOCK_SKEW_WARN", "30")
RUNS_REPORT_INTERVAL = _env("RUNS_REPORT_INTERVAL", "5")
RUNS_FRESH = _env("RUNS_FRESH", "false")
# set | bloom. A Bloom filter takes its full size (here 18 MB) when the crawl opens it, whatever
# it holds, and past its capacity skips more new pages than its error rate says.
DUPEFILTER_BACKEND = _env("DUPEFILTER_BACKEND", "set")
DUPEFILTER_BLOOM_CAPACITY = _env("DUPEFILTER_BLOOM_CAPACITY", "10000000")
DUPEFILTER_BLOOM_ERROR_RATE = _env("DUPEFILTER_BLOOM_ERROR_RATE", "0.001")
# Seconds; with an expiry the seen-state outlives a finished crawl, so a recrawl fetches only
# what was not seen within it. 0: remembered until the crawl finishes.
DUPEFILTER_EXPIRY = _env("DUPEFILTER_EXPIRY", "0")

# --- item pipelines, in order -----------------------------------------------------------------
ITEM_PIPELINES = {
    "scraper.pipelines.clean.CleanPipeline": 100,
    # After validate: holds the valid items of a run whose field coverage broke.
    "scraper.quality.guard.QualityGuardPipeline": 250,
    "scraper.pipelines.validate.ValidatePipeline": 200,
    "scraper.pipelines.dedupe.DedupePipeline": 300,
    "scraper.pipelines.store.StorePipeline": 400,
}
# Comma-separated; empty: each page's declared language, then English.
DATE_LANGUAGES = _env("DATE_LANGUAGES", "")
CLEAN_LOCALE = _env("CLEAN_LOCALE", "")
POSTGRES_BATCH_SIZE = _env("POSTGRES_BATCH_SIZE", "1000")
POSTGRES_FLUSH_INTERVAL = _env("POSTGRES_FLUSH_INTERVAL", "1.0")
POSTGRES_LAST_SEEN_RESOLUTION = _env("POSTGRES_LAST_SEEN_RESOLUTION", "3600")
# While the database is away: new downloads wait once this many rows wait to be written, and
# after this many seconds the crawl stops with its unstored pages in the dead letters.
POSTGRES_MAX_PENDING = _env("POSTGRES_MAX_PENDING", "10000")
POSTGRES_RETRY_TIMEOUT = _env("POSTGRES_RETRY_TIMEOUT", "600")
# A batch that takes longer than this is said, every this many seconds, with its wait event
# and the pids blocking it (asked from a connection of its own).
POSTGRES_STALL_WARN_SECONDS = _env("POSTGRES_STALL_WARN_SECONDS", "30")

# --- data quality (scraper/quality) ----------------------------------------------------------
# Each run is compared with the spider's last finished runs when it finishes; a spider may
# override any of these in its custom_settings.
QUALITY_ENABLED = _env("QUALITY_ENABLED", "true")
QUALITY_BASELINE_RUNS = _env("QUALITY_BASELINE_RUNS", "5")
QUALITY_MIN_ITEMS = _env("QUALITY_MIN_ITEMS", "10")
QUALITY_COVERAGE_TOLERANCE = _env("QUALITY_COVERAGE_TOLERANCE", "0.1")
QUALITY_ITEMS_DROP = _env("QUALITY_ITEMS_DROP", "0.2")
QUALITY_REJECTS_RISE = _env("QUALITY_REJECTS_RISE", "0.05")
QUALITY_GONE_SPIKE = _env("QUALITY_GONE_SPIKE", "0.1")
QUALITY_PAGES_PER_ITEM_RISE = _env("QUALITY_PAGES_PER_ITEM_RISE", "0.5")
QUALITY_RESPONSES_RISE = _env("QUALITY_RESPONSES_RISE", "0.05")
QUALITY_PRICE_SHIFT = _env("QUALITY_PRICE_SHIFT", "0.25")
QUALITY_PRICE_JUMPS = _env("QUALITY_PRICE_JUMPS", "0.1")
QUALITY_DEAD_LETTERS = _env("QUALITY_DEAD_LETTERS", "0.05")
# For CI and schedulers: `scrapy crawl` exits with status 3 when its run is degraded.
QUALITY_FAIL_EXIT = _env("QUALITY_FAIL_EXIT", "true")
QUALITY_ON_BREAK = _env("QUALITY_ON_BREAK", "hold")
QUALITY_GUARD_POLL = _env("QUALITY_GUARD_POLL", "2")
QUALITY_GUARD_WINDOW = _env("QUALITY_GUARD_WINDOW", "200")

# Scrapy's in-memory stats without the per-call deprecation shim (see scraper/stats.py).
STATS_CLASS = "scraper.stats.StatsCollector"

EXTENSIONS = {
    "scraper.extensions.idle_close.IdleClose": 100,
    "scraper.monitoring.exporter.MetricsExporter": 200,
    "scraper.extensions.summary.CrawlSummary": 900,
    "scraper.runs.recorder.RunRecorder": 150,
    # After RunRecorder: a run's data quality is checked once its figures are final.
    "scraper.quality.monitor.QualityMonitor": 160,
    "scraper.extensions.progress.ProgressLog": 500,
    # PROCESSING=decoupled only: a fetcher stays while the stream holds responses.
    "scraper.processing.keepalive.StreamKeepAlive": 110,
    # Long-lived objects out of the garbage collector's sight once the engine starts (GC_FREEZE),
    # and the young generation collected every GC_YOUNG_THRESHOLD (20,000) allocations, not 700.
    "scraper.extensions.gc_freeze.GcFreeze": 50,
    # Worker threads (the Postgres writer, the Redis batcher) take the interpreter back within
    # THREAD_SWITCH_INTERVAL (0.5 ms) instead of CPython's 5 ms: a commit is ~8 such waits.
    "scraper.extensions.switch_interval.SwitchInterval": 55,
    # No DEBUG record built while no handler takes DEBUG (two per page at INFO).
    "scraper.extensions.log_gate.LogGate": 60,
    # Replaced by ProgressLog, which adds the shared queue's depth and age.
    "scrapy.extensions.logstats.LogStats": None,
}
GC_FREEZE = _env("GC_FREEZE", "true")
GC_YOUNG_THRESHOLD = _env("GC_YOUNG_THRESHOLD", "20000")
THREAD_SWITCH_INTERVAL = _env("THREAD_SWITCH_INTERVAL", "0.0005")

# --- scraping API (scraper/scraping_api) ----------------------------------------------------
# No key: the middleware is not loaded and every request is fetched directly.
SCRAPING_API_KEY = _env("SCRAPING_API_KEY", "")
SCRAPING_API_PROVIDER = _env("SCRAPING_API_PROVIDER", "alterlab")  # alterlab | scrapingbee | zyte
SCRAPING_API_URL = _env("SCRAPING_API_URL")  # default: the provider's own
SCRAPING_API_BUDGET = _env("SCRAPING_API_BUDGET", "0")  # credits per crawl process; 0 = none
SCRAPING_API_ROUTING = _env("SCRAPING_API_ROUTING", "")  # e.g. "example.com=always,shop.test=on_block"
SCRAPING_API_DEFAULT_ROUTE = _env("SCRAPING_API_DEFAULT_ROUTE", "always")  # always | never | on_block
SCRAPING_API_MAX_RETRIES = _env("SCRAPING_API_MAX_RETRIES", "5")
SCRAPING_API_RETRY_BACKOFF = _env("SCRAPING_API_RETRY_BACKOFF", "1.0")
SCRAPING_API_RETRY_MAX_DELAY = _env("SCRAPING_API_RETRY_MAX_DELAY", "60")
SCRAPING_API_POLL_INTERVAL = _env("SCRAPING_API_POLL_INTERVAL", "1.0")
SCRAPING_API_POLL_MAX_INTERVAL = _env("SCRAPING_API_POLL_MAX_INTERVAL", "10")
SCRAPING_API_JOB_TIMEOUT = _env("SCRAPING_API_JOB_TIMEOUT", "600")
SCRAPING_API_BLOCK_STATUSES = _env("SCRAPING_API_BLOCK_STATUSES", "403,429")
SCRAPING_API_BLOCK_PATTERN = _env("SCRAPING_API_BLOCK_PATTERN")  # default: common captcha markers
SCRAPING_API_OPTIONS = _env("SCRAPING_API_OPTIONS", "{}")  # JSON, e.g. {"render_js": true}
SCRAPING_API_BLOCKED_RETRIES = _env("SCRAPING_API_BLOCKED_RETRIES", "2")
SCRAPING_API_BLOCKED_ESCALATION = _env("SCRAPING_API_BLOCKED_ESCALATION", '[{"render_js": true}]')
SCRAPING_API_ROBOTSTXT = _env("SCRAPING_API_ROBOTSTXT", "direct")  # direct | api
# After the cookies middleware (700), so the target's cookies are forwarded; after offsite (50),
# retry (550) and redirect (600). Its API calls are sent by a private client, never through
# the downloader: no other component ever sees them.
DOWNLOADER_MIDDLEWARES = {
    # Before anything spends a turn, a slot or a credit on it: http(s), public addresses, the
    # spider's own domains.
    "scraper.middlewares.fetch_boundary.FetchBoundaryMiddleware": 30,
    "scraper.scraping_api.middleware.ScrapingApiMiddleware": 725,
    # After RetryMiddleware (550), so every attempt waits its turn; before the API (725), so a
    # page fetched through it counts against its own site.
    "scraper.politeness.middleware.PolitenessMiddleware": 720,
    # Just outside RetryMiddleware (550): sees what it gave up on.
    "scraper.middlewares.dead_letters.DeadLetterDownloaderMiddleware": 540,
    # First of all: no new download starts while the database is behind.
    "scraper.middlewares.backpressure.StoreBackpressureMiddleware": 10,
    # Frontmost, so its process_response runs last and sees exactly what the spider gets.
    "scraper.archive.middleware.ArchiveMiddleware": 1,
    # PROCESSING=decoupled only. In front of the archive: hands over what the archive saw.
    "scraper.processing.handoff.HandoffMiddleware": 0,
    # PROCESSING=decoupled only: no new download while the stream is full.
    "scraper.processing.backpressure.StreamBackpressureMiddleware": 5,
}

# --- raw archive (scraper/archive) -----------------------------------------------------------
# Off unless ARCHIVE_ENABLED is true or ARCHIVE_URL is set; default place: DATA_DIR/archive.
ARCHIVE_ENABLED = _env("ARCHIVE_ENABLED", "false")
ARCHIVE_URL = _env("ARCHIVE_URL", "")  # a folder, or s3://bucket/prefix
ARCHIVE_S3_ENDPOINT = _env("ARCHIVE_S3_ENDPOINT", "")  # an S3-compatible server; unset: AWS
ARCHIVE_RETENTION_DAYS = _env("ARCHIVE_RETENTION_DAYS", "30")
ARCHIVE_FILE_SIZE = _env("ARCHIVE_FILE_SIZE", str(100 * 1024 * 1024))  # bytes before a new file
ARCHIVE_FILE_AGE = _env("ARCHIVE_FILE_AGE", "300")  # seconds before a new file
ARCHIVE_REQUIRED = _env("ARCHIVE_REQUIRED", "false")  # no page acknowledged without its record

# --- processing apart from fetching (scraper/processing) ------------------------------------
PROCESSING = _env("PROCESSING", "inline")  # inline | decoupled
PROCESSING_MAX_PENDING = _env("PROCESSING_MAX_PENDING", "1000")
PROCESSING_CLAIM_IDLE = _env("PROCESSING_CLAIM_IDLE", "60")
PROCESSING_MAX_DELIVERIES = _env("PROCESSING_MAX_DELIVERIES", "3")
PROCESSING_BATCH = _env("PROCESSING_BATCH", "16")

# --- metrics (Prometheus) -------------------------------------------------------------------
METRICS_ENABLED = _env("METRICS_ENABLED", "true")
METRICS_BIND = _env("METRICS_BIND", "127.0.0.1")
METRICS_PORT = _env("METRICS_PORT", "9410")
METRICS_PORT_RANGE = _env("METRICS_PORT_RANGE", "50")
METRICS_FILE_SD_DIR = _env("METRICS_FILE_SD_DIR")  # default: DATA_DIR/metrics-targets
METRICS_LINGER = _env("METRICS_LINGER", "0")
# Announce this process in METRICS_FILE_SD_DIR; `scrapy crawl` (so every scrapyd job) turns it on.
METRICS_ANNOUNCE = _env("METRICS_ANNOUNCE", "false")

FEED_EXPORT_ENCODING = "utf-8"
# A dropped item (a reject) is one line with its reasons; the item itself is logged at DEBUG.
LOG_FORMATTER = "scraper.logformatter.LogFormatter"

# ``@page PATH`` in a callback's docstring: a contract sample page relative to the spider's site.
# ``@scrapes`` fails on a field left None (a selector that matched nothing), not only an unset one.
SPIDER_CONTRACTS = {
    "scraper.contracts.PageContract": 1,
    "scrapy.contracts.default.ScrapesContract": None,
    "scraper.contracts.ScrapesContract": 3,
}

SPIDER_MIDDLEWARES = {
    "scraper.middlewares.item_origin.ItemOriginMiddleware": 900,
    # Closest to the spider: the first to see a callback's exception.
    "scraper.middlewares.dead_letters.DeadLetterSpiderMiddleware": 950,
}
# How many more times a request whose callback raised is tried before it becomes a dead letter.
DLQ_CALLBACK_RETRIES = _env("DLQ_CALLBACK_RETRIES", "1")
