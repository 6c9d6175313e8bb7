"""Every project setting, declared once: name, kind, default, bounds, whether the environment sets
it, and one line of documentation.

``scraper/settings.py`` takes each environment-set value from here (so a deployment changes
nothing but environment variables), :func:`scraper.config.check_declared` validates every value at start (a bad one fails
naming the setting), and ``docs/reference/settings.md`` is rendered from this table
(:mod:`.reference`; a test fails when the page is stale). The components read their settings with
:mod:`scraper.config`'s getters, whose default comes from here when the call gives none; a test
fails when code reads a setting this table lacks, or names a default that disagrees with it.

Scrapy's own settings are Scrapy's to document: only those this project sets from the
environment, or gives another default, are declared here (``scrapy=True``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: kinds whose value :func:`check` validates by itself; the others (a JSON value, a pattern, a
#: list of CIDRs, per-domain overrides) are checked by their component's reader at start.
SIMPLE = ("int", "float", "bool", "choice", "fraction")


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str  # int, float, bool, choice, fraction, str, url, secret, json, regex, list, path
    default: Any  # the value when unset (None: unset, the component decides; see doc)
    doc: str
    section: str
    env: bool = True  # read from the environment variable of the same name
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    scrapy: bool = False  # one of Scrapy's own settings, given another default or taken from the environment

    def text_default(self) -> str | None:
        """The default as settings.py holds it (environment values are text too)."""
        if self.default is None:
            return None
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        return str(self.default)


def _section(section: str, *entries: tuple) -> list[Setting]:
    out = []
    for name, kind, default, doc, *extra in entries:
        options = extra[0] if extra else {}
        out.append(Setting(name, kind, default, doc, section, **options))
    return out


_ALL: list[Setting] = [
    *_section(
        "Backends",
        (
            "REDIS_URL",
            "secret",
            "",
            "Shared queue, seen-set and run state, e.g. `redis://:password@host:6379/0` or "
            "`rediss://`, `redis+cluster://`, `unix://`; unset: an embedded Redis under `DATA_DIR`.",
        ),
        (
            "DATABASE_URL",
            "secret",
            "",
            "Postgres, e.g. `postgresql://user:password@host:5432/db`; unset: an embedded Postgres under `DATA_DIR`.",
        ),
        (
            "DATA_DIR",
            "path",
            ".data",
            "Where the embedded servers, the fleet secret and local files live, relative "
            "to the project root (the folder of `scrapy.cfg`).",
        ),
        (
            "REDIS_EMBEDDED",
            "bool",
            None,
            "Set at start when the embedded Redis is used (a queue only this machine "
            "writes to: the fetch boundary then allows loopback).",
            {"env": False},
        ),
        (
            "SHARED_STATE",
            "bool",
            None,
            "Whether a process is a crawl node using the shared queue, seen-set, claims, "
            "politeness slots, node registry and database; `scrapy crawl`, scrapyd jobs and `scrapy demo` set it, "
            "other commands run on Scrapy's in-memory state unless given `-s SHARED_STATE=true`.",
            {"env": False},
        ),
    ),
    *_section(
        "Crawling",
        (
            "USER_AGENT",
            "str",
            "scraper (+https://example.invalid/bot)",
            "The User-Agent sent to sites (and the agent robots.txt rules are read for).",
            {"scrapy": True},
        ),
        ("CONCURRENT_REQUESTS", "int", 32, "Scrapy's global concurrency, per process.", {"scrapy": True, "minimum": 1}),
        (
            "CONCURRENT_REQUESTS_PER_DOMAIN",
            "int",
            16,
            "Scrapy's per-site concurrency, per process (see `POLITENESS_CONCURRENCY` for the fleet's).",
            {"scrapy": True, "minimum": 1},
        ),
        (
            "DOWNLOAD_DELAY",
            "float",
            0,
            "Seconds between two requests to one site, per process (see `POLITENESS_RATE` for the fleet's).",
            {"scrapy": True, "minimum": 0},
        ),
        (
            "DOWNLOAD_TIMEOUT",
            "float",
            60,
            "Seconds a download (or a scraping-API call) may take.",
            {"scrapy": True, "minimum": 0.001},
        ),
        (
            "DOWNLOAD_MAXSIZE",
            "int",
            32 * 1024 * 1024,
            "Bytes a response may have after decompression (0: no limit).",
            {"scrapy": True, "minimum": 0},
        ),
        (
            "DOWNLOAD_WARNSIZE",
            "int",
            8 * 1024 * 1024,
            "Bytes past which a response is logged as large.",
            {"scrapy": True, "minimum": 0},
        ),
        (
            "CONCURRENT_ITEMS",
            "int",
            16,
            "Items a response's callback may have in the pipelines at once, per "
            "process (measured: fewer keeps the reactor responsive at no cost).",
            {"scrapy": True, "minimum": 1},
        ),
        (
            "DOWNLOAD_POOL_PER_HOST",
            "int",
            None,
            "Idle connections kept open per host (unset: twice `CONCURRENT_REQUESTS_PER_DOMAIN`).",
            {"minimum": 1},
        ),
        ("LOG_LEVEL", "str", "INFO", "Scrapy's log level (CRITICAL, ERROR, WARNING, INFO, DEBUG).", {"scrapy": True}),
        ("DEMO_SITE_URL", "url", "http://127.0.0.1:8765/", "Start URL of the `demo` spider."),
        (
            "FETCH_ALLOW_NETWORKS",
            "list",
            "",
            "Networks (CIDR, comma-separated) a crawl node may fetch from although "
            "they are not public; loopback, private, link-local and metadata addresses are refused otherwise "
            "(empty with the embedded Redis: loopback allowed).",
        ),
        (
            "URL_DROP_PARAMS",
            "list",
            "",
            "Query parameters that never select content, dropped from every URL (fingerprint and stored "
            "URLs) on top of the known trackers; a spider adds its own (`url_drop_params`) or keeps one "
            "(`url_keep_params`).",
        ),
        (
            "DLQ_CALLBACK_RETRIES",
            "int",
            1,
            "More tries for a request whose callback raised, before it becomes a dead letter.",
            {"minimum": 0},
        ),
    ),
    *_section(
        "Politeness",
        (
            "POLITENESS_RATE",
            "float",
            0,
            "Requests per second to one site from the whole fleet together (0: no "
            "declared limit); held in Redis, shared by every node and spider.",
            {"minimum": 0},
        ),
        (
            "POLITENESS_CONCURRENCY",
            "int",
            0,
            "Requests in flight to one site from the whole fleet (0: no limit).",
            {"minimum": 0},
        ),
        (
            "POLITENESS_OVERRIDES",
            "list",
            "",
            "Per-domain limits, e.g. `shop.test=rate:2/concurrency:4,"
            "slow.test=rate:0.5`; an entry for `example.com` covers its subdomains, which share its budget.",
        ),
        (
            "POLITENESS_MAX_WAIT",
            "float",
            60,
            "Seconds ahead the fleet may book a site's turns; further requests "
            "wait for room, and the site is logged once as saturated.",
            {"minimum": 1},
        ),
        (
            "POLITENESS_ADAPTIVE",
            "bool",
            True,
            "A site that answers 429/503 gets a fleet-wide rate, cut on each throttle and raised on success.",
        ),
        (
            "POLITENESS_ADAPTIVE_DECREASE",
            "float",
            0.7,
            "The share of its rate a throttling site keeps (below 1).",
            {"minimum": 0.05},
        ),
        (
            "POLITENESS_ADAPTIVE_INCREASE",
            "float",
            1.0,
            "Requests/s the adaptive rate gains per second of success.",
            {"minimum": 0.001},
        ),
        ("POLITENESS_ADAPTIVE_MIN_RATE", "float", 0.1, "The lowest adaptive rate, requests/s.", {"minimum": 0.001}),
        (
            "POLITENESS_SLOW_START_RATE",
            "float",
            4.0,
            "Requests/s the fleet starts a site at when nothing declares its rate (slow start; 0: full speed "
            "from the first request); a declared rate or Crawl-delay skips it.",
            {"minimum": 0},
        ),
        (
            "POLITENESS_SLOW_START_GROWTH",
            "float",
            2.0,
            "The factor a slow start's rate grows by each second without a throttle (above 1).",
            {"minimum": 1},
        ),
        (
            "POLITENESS_BLOCK_PATTERN",
            "regex",
            None,
            "A 403 whose body matches this regex (a bot wall's challenge) cuts the site's rate like a 429, "
            "and its page becomes a `blocked` dead letter (unset: common captcha markers; `off`: none).",
        ),
        (
            "POLITENESS_THROTTLED_MAX_WAIT",
            "float",
            600,
            "Seconds a throttled request keeps trying before it becomes a `throttled` dead letter.",
            {"minimum": 1},
        ),
    ),
    *_section(
        "Shared queue",
        (
            "SCHEDULER_SECRET",
            "secret",
            "",
            "The fleet secret every queue entry is signed with: required with a "
            "shared Redis, made once under `DATA_DIR` for the embedded one.",
        ),
        (
            "SCHEDULER_SECRET_PREVIOUS",
            "secret",
            "",
            "The previous fleet secret, still accepted while a rotation drains the queue.",
        ),
        (
            "SCHEDULER_IDLE_TIMEOUT",
            "float",
            10,
            "Seconds the shared queue must stay empty before a spider stops.",
            {"minimum": 0},
        ),
        (
            "SCHEDULER_IDLE_POLL",
            "float",
            0.5,
            "Seconds between two looks at an empty queue.",
            {"env": False, "minimum": 0.05},
        ),
        (
            "SCHEDULER_DUPEFILTER_LOCAL_CACHE",
            "int",
            20000,
            "Fingerprints a process remembers before asking Redis (~100 bytes each; cleared when full).",
            {"minimum": 0},
        ),
        (
            "SCHEDULER_PREFETCH",
            "int",
            4,
            "Requests taken from the shared queue per round trip (leased like the rest).",
            {"minimum": 1},
        ),
        (
            "SCHEDULER_LEASE_TIMEOUT",
            "float",
            60,
            "Seconds a taken request stays leased without renewal before "
            "another worker gets it again (0: at-least-once delivery off).",
            {"minimum": 0},
        ),
        (
            "SCHEDULER_MAX_REDELIVERIES",
            "int",
            5,
            "Redeliveries after which a request (whose workers keep dying) becomes a dead letter.",
            {"minimum": 0},
        ),
        (
            "SCHEDULER_MAX_LEASES",
            "int",
            None,
            "Leases one node holds at most (unset: twice `CONCURRENT_REQUESTS`; "
            "0: no cap); at the cap its pending rows are committed first.",
            {"minimum": 0},
        ),
        (
            "SCHEDULER_SHARDS",
            "int",
            1,
            "Shards of one spider's frontier by domain, each under its own Redis Cluster "
            "hash tag (1: unsharded); fixed for a run.",
            {"minimum": 1},
        ),
        (
            "SCHEDULER_FLUSH_ON_START",
            "bool",
            False,
            "Forget the spider's queue and seen-set at start (a `-s` option).",
            {"env": False},
        ),
        (
            "SCHEDULER_QUEUE_CLASS",
            "str",
            "scraper.queue.queues.PriorityQueue",
            "The crawl scheduler's queue class (set in `settings.py`): signed JSON entries, leases, shards.",
            {"env": False},
        ),
        (
            "SCHEDULER_SERIALIZER",
            "str",
            "scraper.queue.serializer",
            "The module (`dumps`, `loads`) queue entries are written with (set in `settings.py`): JSON, never pickle.",
            {"env": False},
        ),
        (
            "SCHEDULER_QUEUE_KEY",
            "str",
            None,
            "The Redis key of a spider's queue, `%(spider)s` standing for its name (unset: `{<spider>}:requests`). "
            "Only the crawl's scheduler reads it; `scrapy seed`, `queue`, `dlq` and the run state use the "
            "default key: leave it unset.",
            {"env": False},
        ),
        (
            "SCHEDULER_DUPEFILTER_KEY",
            "str",
            None,
            "The Redis key of a spider's seen-set, `%(spider)s` standing for its name (unset: "
            "`{<spider>}:dupefilter`; not read with `DUPEFILTER_BACKEND=bloom`).",
            {"env": False},
        ),
        (
            "DUPEFILTER_BACKEND",
            "choice",
            "set",
            "Where the seen requests are kept: `set` (exact, ~90 bytes per URL) "
            "or `bloom` (~1.8 bytes per URL at 0.1 %).",
            {"choices": ("set", "bloom")},
        ),
        (
            "DUPEFILTER_BLOOM_CAPACITY",
            "int",
            10_000_000,
            "URLs the Bloom filter is sized for (18 MB at 0.1 %).",
            {"minimum": 1},
        ),
        (
            "DUPEFILTER_BLOOM_ERROR_RATE",
            "float",
            0.001,
            "The Bloom filter's false-positive rate at capacity (new pages skipped).",
            {"minimum": 0.000001, "maximum": 0.5},
        ),
        (
            "DUPEFILTER_EXPIRY",
            "float",
            0,
            "Seconds after which a seen request is forgotten, so its page is crawled "
            "again (0: never); forgotten between half of it and all of it.",
            {"minimum": 0},
        ),
    ),
    *_section(
        "Runs",
        (
            "RUNS_NODE_TTL",
            "float",
            60,
            "Seconds without a heartbeat after which a node of another host counts as "
            "gone (one of this host whose process is gone counts as gone at once).",
            {"minimum": 1},
        ),
        (
            "RUNS_CLOCK_SKEW_WARN",
            "float",
            30,
            "A node whose clock is off from Redis' by more than this many seconds "
            "says so at start (leases and heartbeats use Redis' clock anyway).",
            {"minimum": 0},
        ),
        (
            "RUNS_REPORT_INTERVAL",
            "float",
            5,
            "Seconds between a node's reports of its figures to the run.",
            {"minimum": 0.1},
        ),
        (
            "RUNS_FRESH",
            "bool",
            False,
            "Discard a stopped run instead of resuming it (what `scrapy crawl --fresh` sets).",
        ),
    ),
    *_section(
        "Revisits",
        (
            "REVISIT_ENABLED",
            "bool",
            True,
            "Keep each page's validators and change history (table `pages`); revisit runs send conditional "
            "requests (`If-None-Match`, `If-Modified-Since`), and a 304 keeps the page's items as seen.",
        ),
        (
            "REVISIT_DUE",
            "bool",
            False,
            "A revisit run: only the known pages that are due, and new links (what `scrapy crawl --due` sets); "
            "gone-marking covers only the pages it visited.",
        ),
        (
            "REVISIT_MIN_INTERVAL",
            "float",
            3600,
            "Shortest interval between two visits of a page, in seconds (a page that keeps changing).",
            {"minimum": 0},
        ),
        (
            "REVISIT_MAX_INTERVAL",
            "float",
            2592000,
            "Longest interval between two visits of a page, in seconds (30 days; also how long a sitemap's "
            "`lastmod` is trusted without a visit).",
            {"minimum": 0},
        ),
        (
            "REVISIT_INITIAL_INTERVAL",
            "float",
            86400,
            "A new page's first interval, in seconds, unless its sitemap `changefreq` says another.",
            {"minimum": 0},
        ),
        (
            "REVISIT_GROWTH",
            "float",
            1.5,
            "Factor the interval grows by after a visit that found the page unchanged (it halves on a change).",
            {"minimum": 1},
        ),
        (
            "REVISIT_LISTING_INTERVAL",
            "float",
            0,
            "Seconds between two visits of a listing page (one that yields no items) in revisit runs; 0: every run.",
            {"minimum": 0},
        ),
        (
            "REVISIT_HINT_MISSES",
            "int",
            3,
            "Times a page's sitemap `lastmod` may say it changed when it had not before its own history "
            "decides instead.",
            {"minimum": 1},
        ),
        (
            "REVISIT_CACHE_PAGES",
            "int",
            20000,
            "Page states a crawl node keeps at hand (the most recently used); the others are read from "
            "the `pages` table by key when a link, a due page or a visit needs them.",
            {"minimum": 100},
        ),
        (
            "REVISIT_SEED_AHEAD",
            "int",
            2000,
            "A revisit run queues the pages due by their history while the shared queue holds fewer "
            "requests than this: they are read from the database as it drains, not all at the start.",
            {"minimum": 1},
        ),
    ),
    *_section(
        "Cleaning",
        (
            "DATE_LANGUAGES",
            "list",
            "",
            "Languages dates are read in, e.g. `de,en` (a spider's `date_languages` "
            "wins); unset: the page's declared language, then English.",
        ),
        (
            "CLEAN_LOCALE",
            "str",
            "",
            "The locale (`de-CH`) numbers and numeric dates are read by when neither the "
            "request's meta `locale`, the spider's `locale` nor the page declares one; unset: only unambiguous "
            "shapes.",
        ),
        (
            "CLEAN_DEFAULT_CURRENCY",
            "str",
            None,
            "Currency of a price with no mark at all (a spider's `default_currency` wins).",
            {"env": False},
        ),
        (
            "CLEAN_DATE_ORDER",
            "str",
            None,
            "Date order of numeric dates, e.g. `MDY` (a spider's `date_order` wins).",
            {"env": False},
        ),
        (
            "CLEAN_TIMEZONE",
            "str",
            None,
            "Timezone of times without one (unset: UTC; a spider's `timezone` wins).",
            {"env": False},
        ),
    ),
    *_section(
        "Storage",
        ("POSTGRES_BATCH_SIZE", "int", 1000, "Rows per upsert batch.", {"minimum": 1}),
        (
            "HISTORY_RETENTION_DAYS",
            "float",
            0,
            "Days of `item_changes` kept: whole months older than this are dropped (a partition each, "
            "at every node's start and `scrapy migrate`) once every change-feed sink has published "
            "them; 0: kept forever.",
            {"minimum": 0},
        ),
        (
            "POSTGRES_FLUSH_INTERVAL",
            "float",
            1.0,
            "Seconds before a partial batch is written anyway.",
            {"minimum": 0.01},
        ),
        (
            "POSTGRES_LAST_SEEN_RESOLUTION",
            "float",
            3600,
            "Refresh `last_seen` of unchanged rows at most this often, in seconds (0: on every sighting).",
            {"minimum": 0},
        ),
        (
            "POSTGRES_MAX_PENDING",
            "int",
            10000,
            "Rows waiting for the database before new downloads are held.",
            {"minimum": 1},
        ),
        (
            "POSTGRES_RETRY_TIMEOUT",
            "float",
            600,
            "Seconds to keep retrying an unreachable database; then the "
            "unstored pages become dead letters and the spider stops.",
            {"minimum": 0},
        ),
        (
            "POSTGRES_STALL_WARN_SECONDS",
            "float",
            30,
            "While a batch has not committed for this long, warn every "
            "this many seconds with the rows waiting and what Postgres says the writer waits on (0: never).",
            {"minimum": 0},
        ),
    ),
    *_section(
        "Data quality",
        ("QUALITY_ENABLED", "bool", True, "Check each finished run's data quality."),
        (
            "QUALITY_BASELINE_RUNS",
            "int",
            5,
            "A finished run is compared with the spider's last N checked runs.",
            {"minimum": 1},
        ),
        (
            "QUALITY_MIN_ITEMS",
            "int",
            10,
            "Fewer stored items of a type (or prices seen before): their coverage (price pairs) is not judged.",
            {"minimum": 0},
        ),
        (
            "QUALITY_COVERAGE_TOLERANCE",
            "fraction",
            0.1,
            "A field with no declared expectation fails below its average coverage over the baseline less this.",
        ),
        ("QUALITY_ITEMS_DROP", "fraction", 0.2, "Items stored may drop by this share of the baseline's median."),
        ("QUALITY_REJECTS_RISE", "fraction", 0.05, "A field's share of rejected items may rise by this much."),
        ("QUALITY_GONE_SPIKE", "fraction", 0.1, "Rows gone in one run, as a share of the baseline's items."),
        (
            "QUALITY_PAGES_PER_ITEM_RISE",
            "fraction",
            0.5,
            "Pages per stored item may rise by this share.",
            {"maximum": float("inf")},
        ),
        (
            "QUALITY_RESPONSES_RISE",
            "fraction",
            0.05,
            "The share of error, blocked or empty responses may rise by this.",
        ),
        (
            "QUALITY_PRICE_SHIFT",
            "fraction",
            0.25,
            "A price that moved by more than this share run over run jumped.",
            {"maximum": float("inf")},
        ),
        ("QUALITY_PRICE_JUMPS", "fraction", 0.1, "At most this share of an item type's prices seen before may jump."),
        ("QUALITY_DEAD_LETTERS", "fraction", 0.05, "At most this share of a run's pages may end as dead letters."),
        (
            "QUALITY_UNREADABLE",
            "fraction",
            0.05,
            "At most this share of an item type's items may have a value on the page the cleaner could not read.",
        ),
        ("QUALITY_FAIL_EXIT", "bool", True, "`scrapy crawl` exits 3 when its run is degraded (false keeps 0)."),
        (
            "QUALITY_ON_BREAK",
            "choice",
            "hold",
            "What a run does when the live guard sees a field break: `hold` its "
            "items and gone-marks with the run, `stop` the spider, or `continue`.",
            {"choices": ("hold", "stop", "continue")},
        ),
        (
            "QUALITY_GUARD_POLL",
            "float",
            2,
            "Seconds between two looks of each node at the fleet's break and rejects.",
            {"minimum": 0.1},
        ),
        (
            "QUALITY_GUARD_WINDOW",
            "int",
            200,
            "The live guard judges the last this many items of a type.",
            {"minimum": 50},
        ),
    ),
    *_section(
        "Process tuning",
        ("GC_FREEZE", "bool", True, "Long-lived objects out of the garbage collector's sight once the engine starts."),
        (
            "GC_YOUNG_THRESHOLD",
            "int",
            20000,
            "Allocations between two young-generation collections while a crawl runs (0: CPython's 700).",
            {"minimum": 0},
        ),
        (
            "THREAD_SWITCH_INTERVAL",
            "float",
            0.0005,
            "Seconds after which a worker thread gets the interpreter back from a busy crawl (0: CPython's 0.005).",
            {"minimum": 0},
        ),
    ),
    *_section(
        "Scraping API",
        ("SCRAPING_API_KEY", "secret", "", "Key of the scraping API; unset, pages are fetched directly. Never logged."),
        (
            "SCRAPING_API_PROVIDER",
            "choice",
            "alterlab",
            "The provider: `alterlab`, `scrapingbee` or `zyte`.",
            {"choices": ("alterlab", "scrapingbee", "zyte")},
        ),
        ("SCRAPING_API_URL", "url", None, "Base URL of the scraping API (unset: the provider's own)."),
        (
            "SCRAPING_API_BUDGET",
            "float",
            0,
            "What one run may spend across the fleet, in the provider's billing unit (0: no budget).",
            {"minimum": 0},
        ),
        ("SCRAPING_API_ROUTING", "list", "", "Per-domain route, e.g. `shop.test=on_block,cdn.test=never`."),
        (
            "SCRAPING_API_DEFAULT_ROUTE",
            "choice",
            "always",
            "The route of the other domains.",
            {"choices": ("always", "never", "on_block")},
        ),
        ("SCRAPING_API_MAX_RETRIES", "int", 5, "Retries of a failed API call.", {"minimum": 0}),
        (
            "SCRAPING_API_RETRY_BACKOFF",
            "float",
            1.0,
            "Seconds of the first retry's backoff (doubling).",
            {"minimum": 0},
        ),
        (
            "SCRAPING_API_RETRY_MAX_DELAY",
            "float",
            60,
            "The longest wait between two retries, unless the API asks for longer.",
            {"minimum": 0},
        ),
        (
            "SCRAPING_API_POLL_INTERVAL",
            "float",
            1.0,
            "Seconds between two polls of an asynchronous job (growing).",
            {"minimum": 0.01},
        ),
        ("SCRAPING_API_POLL_MAX_INTERVAL", "float", 10, "The longest wait between two polls.", {"minimum": 0.01}),
        ("SCRAPING_API_JOB_TIMEOUT", "float", 600, "Seconds an asynchronous job may take.", {"minimum": 0.1}),
        (
            "SCRAPING_API_BLOCK_STATUSES",
            "list",
            "403,429",
            "Statuses of a direct answer that escalate its domain to the API (route `on_block`).",
        ),
        (
            "SCRAPING_API_BLOCK_PATTERN",
            "regex",
            None,
            "A direct answer whose body matches is a block (unset: common captcha markers).",
        ),
        (
            "SCRAPING_API_OPTIONS",
            "json",
            "{}",
            'JSON options for the API (`{"render_js": true}`); a spider\'s '
            '`scraping_api` dict and `request.meta["scraping_api"]` override.',
        ),
        (
            "SCRAPING_API_BLOCKED_RETRIES",
            "int",
            2,
            "Retries of a page the API reports blocked by the target, each "
            "with the next step of `SCRAPING_API_BLOCKED_ESCALATION`.",
            {"minimum": 0},
        ),
        (
            "SCRAPING_API_BLOCKED_ESCALATION",
            "json",
            '[{"render_js": true}]',
            "JSON list of the options each blocked retry adds.",
        ),
        (
            "SCRAPING_API_ROBOTSTXT",
            "choice",
            "direct",
            "`direct`: robots.txt is fetched without the API; `api`.",
            {"choices": ("direct", "api")},
        ),
    ),
    *_section(
        "Raw archive",
        (
            "ARCHIVE_ENABLED",
            "bool",
            False,
            "Archive every response the spiders see as WARC (setting `ARCHIVE_URL` turns it on too).",
        ),
        (
            "ARCHIVE_URL",
            "str",
            "",
            "Where: a folder (default `DATA_DIR/archive`), `s3://bucket/prefix` (credentials from the "
            "usual `AWS_*` variables) or `gs://bucket/prefix` (Google's default credentials).",
        ),
        ("ARCHIVE_S3_ENDPOINT", "url", "", "URL of an S3-compatible server (MinIO, Ceph...); unset: AWS."),
        (
            "ARCHIVE_GCS_ENDPOINT",
            "url",
            "",
            "For `ARCHIVE_URL=gs://...`: URL of a GCS emulator or GCS-compatible server, e.g. "
            "`http://127.0.0.1:9023`, reached anonymously; unset: Google Cloud Storage, with "
            "Google's default credentials (`GOOGLE_APPLICATION_CREDENTIALS`...).",
        ),
        (
            "ARCHIVE_RETENTION_DAYS",
            "float",
            30,
            "Days `scrapy archive prune` keeps; a file a kept revisit record points at is kept too.",
            {"minimum": 0.001},
        ),
        (
            "ARCHIVE_FILE_SIZE",
            "int",
            100 * 1024 * 1024,
            "Bytes before the archive starts a new file.",
            {"minimum": 1024},
        ),
        ("ARCHIVE_FILE_AGE", "float", 300, "Seconds before the archive starts a new file.", {"minimum": 0.1}),
        (
            "ARCHIVE_REQUIRED",
            "bool",
            False,
            "A page goes on only once its record is on disk; when the archive fails, "
            "its pages are not acknowledged and the crawl stops.",
        ),
        ("ARCHIVE_REPLAY", "bool", False, "Set by `scrapy reprocess`: pages come from the archive.", {"env": False}),
        ("ARCHIVE_REPLAY_FOLLOW", "bool", False, "Set by `scrapy reprocess --follow`.", {"env": False}),
        ("ARCHIVE_REPLAY_ITEMS_KEY", "str", None, "Set by `scrapy reprocess`: its own dedupe claims.", {"env": False}),
    ),
    *_section(
        "Decoupled processing",
        (
            "PROCESSING",
            "choice",
            "inline",
            "`inline` (each crawl node runs the callbacks) or `decoupled` (crawl nodes "
            "hand each response to a Redis Stream; `scrapy process SPIDER` runs callbacks and pipelines).",
            {"choices": ("inline", "decoupled")},
        ),
        (
            "PROCESSING_MAX_PENDING",
            "int",
            1000,
            "Responses the stream may hold before fetchers hold new downloads.",
            {"minimum": 1},
        ),
        (
            "PROCESSING_CLAIM_IDLE",
            "float",
            60,
            "Seconds a processor may hold an entry unrenewed (it died) before another takes it over.",
            {"minimum": 0.1},
        ),
        (
            "PROCESSING_MAX_DELIVERIES",
            "int",
            3,
            "Deliveries of one entry before it becomes a dead letter.",
            {"minimum": 1},
        ),
        ("PROCESSING_BATCH", "int", 16, "Entries a processor reads per round trip.", {"minimum": 1}),
        (
            "PROCESSING_PROCESSOR",
            "bool",
            False,
            "Set by `scrapy process`: this process runs callbacks, fetches nothing.",
            {"env": False},
        ),
    ),
    *_section(
        "Change feed",
        (
            "CHANGEFEED_BATCH",
            "int",
            500,
            "Events `scrapy feed run` reads and sends per batch (one confirm wait, one saved position).",
            {"minimum": 1, "maximum": 100_000},
        ),
        (
            "CHANGEFEED_POLL_INTERVAL",
            "float",
            0.5,
            "Seconds the relay waits, once everything committed is published, before looking again.",
            {"minimum": 0.01},
        ),
        (
            "CHANGEFEED_RETRY_MAX_GAP",
            "float",
            30,
            "Longest wait between two sends of a batch a sink did not confirm (the waits double up to it).",
            {"minimum": 0.1},
        ),
        (
            "CHANGEFEED_PUBLISH_TIMEOUT",
            "float",
            30,
            "Seconds a sink may take to confirm a batch before it is sent again.",
            {"minimum": 0.1},
        ),
        (
            "CHANGEFEED_RABBITMQ_URL",
            "secret",
            "",
            "RabbitMQ for `--sink rabbitmq`, e.g. `amqp://user:password@host:5672/vhost`.",
        ),
        (
            "CHANGEFEED_RABBITMQ_STREAM",
            "str",
            "item_changes",
            "The RabbitMQ stream (a queue of type stream) events go to.",
        ),
        (
            "CHANGEFEED_RABBITMQ_MAX_AGE",
            "str",
            "7D",
            "How long the stream keeps events for late consumers (`x-max-age`: a number and Y, M, D, h, m or s).",
        ),
        ("CHANGEFEED_NATS_URL", "secret", "", "NATS for `--sink nats`, e.g. `nats://user:password@host:4222`."),
        ("CHANGEFEED_NATS_STREAM", "str", "ITEM_CHANGES", "The JetStream stream events go to (made if missing)."),
        (
            "CHANGEFEED_NATS_SUBJECT",
            "str",
            "item_changes",
            "Subject prefix: an event goes to `PREFIX.<table>.<kind>`; the stream takes `PREFIX.>`.",
        ),
        (
            "CHANGEFEED_NATS_DUPLICATE_WINDOW",
            "float",
            120,
            "Seconds JetStream drops a second copy of an event id; must exceed "
            "`CHANGEFEED_RETRY_MAX_GAP` + `CHANGEFEED_PUBLISH_TIMEOUT`.",
            {"minimum": 1},
        ),
        ("CHANGEFEED_WEBHOOK_URL", "secret", "", "Where `--sink webhook` POSTs batches of events."),
        (
            "CHANGEFEED_WEBHOOK_SECRET",
            "secret",
            "",
            "HMAC-SHA256 key of the `X-Changefeed-Signature` header (at least 16 characters).",
        ),
        (
            "CHANGEFEED_WEBHOOK_TRIES",
            "int",
            6,
            "Sends of one batch (waits doubling up to `CHANGEFEED_RETRY_MAX_GAP`) before its events "
            "become dead letters (`change_feed_dead_letters`).",
            {"minimum": 1},
        ),
        ("CHANGEFEED_WEBHOOK_TIMEOUT", "float", 10, "Seconds one webhook request may take.", {"minimum": 0.1}),
        (
            "CHANGEFEED_LAKE_FOLDER",
            "path",
            None,
            "Where `--sink lake` writes its Iceberg tables (`changes`, `current`: Parquet files and "
            "metadata): a folder, `s3://bucket/prefix` or `gs://bucket/prefix`; their catalog is in the "
            "project's Postgres.",
        ),
        ("CHANGEFEED_LAKE_NAMESPACE", "str", "changefeed", "The Iceberg namespace of the lake's tables."),
        (
            "CHANGEFEED_LAKE_ENDPOINT",
            "url",
            "",
            "An S3-compatible or GCS endpoint for the lake's bucket (MinIO, an emulator); unset: the "
            "cloud's own. Credentials come from the environment (`AWS_*`, `GOOGLE_APPLICATION_CREDENTIALS`).",
        ),
        (
            "CHANGEFEED_LAKE_TIMEOUT",
            "float",
            30,
            "Seconds one request to the lake's bucket may take, retries included, before the batch "
            "is sent again (the relay waits for the bucket as for any sink).",
            {"minimum": 1},
        ),
        (
            "CHANGEFEED_LAKE_KEEP_DAYS",
            "float",
            7,
            "Days of snapshots `scrapy feed compact` keeps (time travel); older snapshots and the "
            "files only they used are deleted.",
            {"minimum": 0},
        ),
        (
            "CHANGEFEED_METRICS_PORT",
            "int",
            0,
            "Port of the relay's own Prometheus endpoint (`scraper_changefeed_*`, bound to `METRICS_BIND`); 0: none.",
            {"minimum": 0, "maximum": 65535},
        ),
    ),
    *_section(
        "Metrics",
        ("METRICS_ENABLED", "bool", True, "Serve Prometheus metrics from each crawl process."),
        ("METRICS_BIND", "str", "127.0.0.1", "Address of the metrics endpoint."),
        ("METRICS_PORT", "int", 9410, "First port tried for it.", {"minimum": 0, "maximum": 65535}),
        ("METRICS_PORT_RANGE", "int", 50, "Ports tried from `METRICS_PORT` on.", {"minimum": 1}),
        (
            "METRICS_FILE_SD_DIR",
            "path",
            None,
            "Where each crawl process announces its endpoint to Prometheus "
            "(file_sd); unset: `DATA_DIR/metrics-targets`.",
        ),
        ("METRICS_ANNOUNCE", "bool", False, "Write that target file (`scrapy crawl` and scrapyd jobs set it)."),
        ("METRICS_LINGER", "float", 0, "Seconds to keep serving after the spider closed.", {"minimum": 0}),
        (
            "METRICS_MAX_DOMAINS",
            "int",
            50,
            "Domains latency is labelled for (the rest share one label).",
            {"env": False, "minimum": 0},
        ),
    ),
    *_section(
        "Provenance",
        (
            "PROVENANCE_ENABLED",
            "bool",
            True,
            "Learn which selector produced each field of each item (`item._sources`) and count it per "
            "run in the table `field_sources` (`scrapy sources SPIDER`); no change to the spiders.",
        ),
    ),
    *_section(
        "Repair",
        (
            "REPAIR_ENABLED",
            "bool",
            True,
            "When the guard breaks a field, learn where it went from the run's pages and the stable "
            "stored values, and read it from there once verified (table `repairs`, `scrapy repairs SPIDER`).",
        ),
        (
            "REPAIR_APPLY",
            "choice",
            "auto",
            "`auto`: a verified repair is applied at once, on every node; `review`: it waits for "
            "`scrapy repairs SPIDER --accept ID`.",
            {"choices": ("auto", "review")},
        ),
        (
            "REPAIR_PAGES",
            "int",
            300,
            "Pages kept in memory per item type as evidence (pages that yielded one item of the type).",
            {"minimum": 10},
        ),
        (
            "REPAIR_MIN_PAGES",
            "int",
            20,
            "Pages with a stable stored value a repair needs before it is tried (a share is kept apart "
            "to validate on).",
            {"minimum": 3},
        ),
        (
            "REPAIR_STABLE_RUNS",
            "int",
            1,
            "Earlier runs a stored value must have gone unchanged through to count as evidence.",
            {"minimum": 1},
        ),
        ("REPAIR_TRIES", "int", 3, "Tries per broken field and run (each with new pages).", {"minimum": 1}),
        (
            "REPAIR_POLL",
            "float",
            5.0,
            "Seconds between two reads of the repairs in force (a repair one node learns reaches the others).",
            {"minimum": 0.1},
        ),
    ),
    *_section(
        "Rendering",
        (
            "RENDER_BROWSER",
            "str",
            "/usr/bin/chromium",
            "The Chromium that renders pages a spider marks `render` (Debian's `chromium`: `make tools`).",
        ),
        (
            "RENDER_MAX_PAGES",
            "int",
            4,
            "Pages rendered at once by one node (each a browser tab; the rest wait their turn).",
            {"minimum": 1},
        ),
        (
            "RENDER_CONTEXT_PAGES",
            "int",
            50,
            "Pages a browser context serves before a fresh one replaces it (cookies, caches and leaks go with it).",
            {"minimum": 1},
        ),
        (
            "RENDER_PAGE_TIMEOUT",
            "float",
            30,
            "Seconds one page may take in the browser, its actions included (then a timeout, retried as any).",
            {"minimum": 0.1},
        ),
        (
            "RENDER_BLOCK_RESOURCES",
            "list",
            "image,font,media",
            "Resource types a rendered page is never given (comma-separated Playwright names; `none`: none).",
        ),
        (
            "RENDER_CRASH_RETRIES",
            "int",
            2,
            "Tries again of a page whose browser crashed under it (the browser is started again first).",
            {"minimum": 0},
        ),
        (
            "RENDER_ERROR_RETRIES",
            "int",
            2,
            "Renders again of a page that shows the error its spider named (`retry_if`), before it is a dead letter.",
            {"minimum": 0},
        ),
        (
            "RENDER_MAX_ACTIONS",
            "int",
            100,
            "Clicks (`click`) and scrolls (`scroll`) at most per page.",
            {"minimum": 1},
        ),
        (
            "RENDER_SETTLE_TIME",
            "float",
            0.5,
            "Seconds a page may take to grow after a scroll or a click before it is taken as complete.",
            {"minimum": 0.01},
        ),
        (
            "RENDER_MAX_REDIRECTS",
            "int",
            5,
            "Redirects one request of a rendered page may follow (each hop checked by the fetch boundary).",
            {"minimum": 0},
        ),
    ),
]

REGISTRY: dict[str, Setting] = {s.name: s for s in _ALL}
assert len(REGISTRY) == len(_ALL), "a setting is declared twice"


def environment_values(environ: dict[str, str]) -> dict[str, Any]:
    """What settings.py sets: for each environment-set setting, its variable's value if set and
    not empty, else the default as text; a setting with no default is left out unless set."""
    values: dict[str, Any] = {}
    for setting in _ALL:
        if not setting.env:
            continue
        given = environ.get(setting.name)
        if given not in (None, ""):
            values[setting.name] = given
        elif setting.default is not None:
            values[setting.name] = setting.text_default()
    return values


def get(name: str) -> Setting:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"{name} is not a declared setting (scraper/conf/registry.py)") from None
