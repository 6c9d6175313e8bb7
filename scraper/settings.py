"""Project settings. Everything a deployment changes comes from the environment, here and only here.

Every project setting is declared once, in :mod:`scraper.conf.registry` (name, kind, default,
bounds, one line of doc; the reference is ``docs/reference/settings.md``): each one the
environment sets takes its variable's value here when the variable is set and not empty, else the
registry's default, as text; the components check the values at start and name a bad one. The rest
of this file wires Scrapy's components together.

``SHARED_STATE`` (a ``-s`` option, not from the environment) says whether a process is a crawl
node, using the shared queue, seen-set, dedupe claims, politeness slots, node registry, metrics
target folder and database. ``scrapy crawl`` (so every scrapyd job) and ``scrapy demo`` set it;
every other command (``shell``, ``fetch``, ``view``, ``parse``, ``check``, ``runspider``, a
script) runs with Scrapy's in-memory scheduler and touches none of them unless given
``-s SHARED_STATE=true``. See :mod:`scraper.shared_state`.

Passwords in the URLs never reach the logs: see :mod:`scraper.runtime.secrets`.
"""

import os

from scraper.conf.registry import environment_values

BOT_NAME = "scraper"

SPIDER_MODULES = ["scraper.spiders"]
NEWSPIDER_MODULE = "scraper.spiders"
COMMANDS_MODULE = "scraper.commands"
TEMPLATES_DIR = os.path.join(os.path.dirname(__file__), "templates")


# REDIS_URL, DATABASE_URL, DATA_DIR, USER_AGENT, CONCURRENT_REQUESTS, POLITENESS_*, SCHEDULER_*,
# POSTGRES_*, QUALITY_*, SCRAPING_API_*, ARCHIVE_*, PROCESSING_*, METRICS_*...: the environment's
# values, else the registry's defaults (scraper/conf/registry.py).
globals().update(environment_values(os.environ))


# --- backends -------------------------------------------------------------------------------

# Resolves REDIS_URL and DATABASE_URL (or starts the embedded servers) before any component is built.
ADDONS = {
    "scraper.addon.BackendsAddon": 0,
    "scraper.scraping_api.addon.ScrapingApiAddon": 10,
    "scraper.archive.addon.ArchiveAddon": 20,
}

# --- crawling -------------------------------------------------------------------------------
ROBOTSTXT_OBEY = True
DOWNLOAD_HANDLERS = {
    # Scrapy's HTTP/1.1 handler, and a browser for the requests marked `render` (scraper/rendering).
    "http": "scraper.rendering.handler.RenderingDownloadHandler",
    "https": "scraper.rendering.handler.RenderingDownloadHandler",
    # A crawl node fetches the web, nothing else: a queue entry must not read local files or
    # reach buckets and FTP servers with the node's credentials (see docs/operations/security.md).
    "file": None,
    "s3": None,
    "ftp": None,
    "data": None,
}

# Both execute code sent to them over a socket; nothing in production should.
TELNETCONSOLE_ENABLED = False
REMOTE_CONTROL_ENABLED = False

# --- shared queue (scrapy-redis) --------------------------------------------------------------
SCHEDULER = "scraper.node.scheduler.SharedScheduler"
SCHEDULER_QUEUE_CLASS = "scraper.queue.queues.PriorityQueue"
SCHEDULER_SERIALIZER = "scraper.queue.serializer"
DUPEFILTER_CLASS = "scraper.queue.dupefilter.SharedDupeFilter"

# --- item pipelines, in order -----------------------------------------------------------------
ITEM_PIPELINES = {
    "scraper.pipelines.clean.CleanPipeline": 100,
    # After validate: holds the valid items of a run whose field coverage broke.
    "scraper.quality.guard.QualityGuardPipeline": 250,
    "scraper.pipelines.validate.ValidatePipeline": 200,
    "scraper.pipelines.dedupe.DedupePipeline": 300,
    "scraper.pipelines.store.StorePipeline": 400,
}

# Scrapy's in-memory stats without the per-call deprecation shim (see scraper/runtime/stats.py).
STATS_CLASS = "scraper.runtime.stats.StatsCollector"

EXTENSIONS = {
    "scraper.extensions.idle_close.IdleClose": 100,
    "scraper.monitoring.exporter.MetricsExporter": 200,
    "scraper.extensions.summary.CrawlSummary": 900,
    "scraper.runs.recorder.RunRecorder": 150,
    # After RunRecorder: a run's data quality is checked once its figures are final.
    "scraper.quality.monitor.QualityMonitor": 160,
    "scraper.extensions.progress.ProgressLog": 500,
    # The crawl's one Postgres writer, made by the first component that stores.
    "scraper.storage.owner.PostgresStore": 140,
    # Each page's validators and change history (scraper/revisit).
    "scraper.revisit.recorder.RevisitRecorder": 170,
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

# --- downloader middlewares -------------------------------------------------------------------
# The scraping API's (no key: not loaded, every request fetched directly) after the cookies
# middleware (700), so the target's cookies are forwarded; after offsite (50),
# retry (550) and redirect (600). Its API calls are sent by a private client, never through
# the downloader: no other component ever sees them.
DOWNLOADER_MIDDLEWARES = {
    # Before anything spends a turn, a slot or a credit on it: http(s), public addresses, the
    # spider's own domains.
    "scraper.middlewares.fetch_boundary.FetchBoundaryMiddleware": 30,
    "scraper.scraping_api.middleware.ScrapingApiMiddleware": 725,
    # Before the API (725), so the validators it adds are forwarded; its process_response sees
    # the target's 304 as the API passed it on.
    "scraper.revisit.conditional.ConditionalRequestsMiddleware": 700,
    # After RetryMiddleware (550), so every attempt waits its turn; before the API (725), so a
    # page fetched through it counts against its own site.
    "scraper.politeness.middleware.PolitenessMiddleware": 720,
    # Marks the requests to render in this node's browser (a `render` meta key or spider
    # attribute): after the revisit's validators (700), before the API (725), which leaves them alone.
    "scraper.rendering.middleware.RenderMiddleware": 710,
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

FEED_EXPORT_ENCODING = "utf-8"
# A dropped item (a reject) is one line with its reasons; the item itself is logged at DEBUG.
LOG_FORMATTER = "scraper.runtime.logformatter.LogFormatter"

# ``@page PATH`` in a callback's docstring: a contract sample page relative to the spider's site.
# ``@scrapes`` fails on a field left None (a selector that matched nothing), not only an unset one.
SPIDER_CONTRACTS = {
    "scraper.contracts.PageContract": 1,
    "scrapy.contracts.default.ScrapesContract": None,
    "scraper.contracts.ScrapesContract": 3,
}

# One page, one identity (scraper/identity): the fingerprint of the URL without its trackers,
# session id and fragment, and of the page a known alias names.
REQUEST_FINGERPRINTER_CLASS = "scraper.identity.fingerprint.IdentityFingerprinter"

SPIDER_MIDDLEWARES = {
    # Learns aliases from canonical links, and gives the items their page's canonical URL.
    "scraper.identity.canonical.CanonicalMiddleware": 890,
    # After the canonical link is read (the page's identity): what each page yielded, and in a
    # revisit run, only the links to pages that are due.
    "scraper.revisit.due.RevisitMiddleware": 880,
    "scraper.middlewares.item_origin.ItemOriginMiddleware": 900,
    # Next to the spider: each item's raw values, as yielded, matched to the selector calls of its
    # callback (PROVENANCE_ENABLED; see scraper/repair/provenance.py).
    "scraper.repair.middleware.ProvenanceMiddleware": 940,
    # Just after it: fields a repair reads again (REPAIR_ENABLED; see scraper/repair/live.py), and
    # the pages a repair learns from.
    "scraper.repair.live.RepairMiddleware": 935,
    # Closest to the spider: the first to see a callback's exception.
    "scraper.middlewares.dead_letters.DeadLetterSpiderMiddleware": 950,
}
