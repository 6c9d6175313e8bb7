"""Serve the crawl's metrics to Prometheus from every crawl process.

Many crawl processes share a machine (scrapyd runs one process per job), so a fixed port would
collide. Each process binds the first free port of ``METRICS_PORT`` ..
``METRICS_PORT + METRICS_PORT_RANGE - 1`` on ``METRICS_BIND`` (127.0.0.1 unless told otherwise:
``/metrics`` is not for the public) and announces itself in a Prometheus ``file_sd`` target
file in ``METRICS_FILE_SD_DIR``, which it removes when it stops. Point Prometheus'
``file_sd_configs`` at that folder and every process is found, whatever port it got.

A target file must never outlive its process, or Prometheus sums a dead process' last counts
with the live ones: it is removed on every way out of the process (spider closed, exit,
exception), and a process killed outright (SIGKILL, OOM) has its file removed by the next
process on the host that loads this extension. Only crawl processes announce a target
(``METRICS_ANNOUNCE``, set by ``scrapy crawl`` and so by scrapyd jobs): ``scrapy fetch`` and
friends serve nothing worth scraping.

Settings: ``METRICS_ENABLED`` (true), ``METRICS_BIND``, ``METRICS_PORT`` (9410; 0 for any free
port), ``METRICS_PORT_RANGE`` (50), ``METRICS_FILE_SD_DIR`` (``DATA_DIR/metrics-targets``, relative
to the project root; empty to disable), ``METRICS_MAX_DOMAINS`` (50: latency is labelled per domain for that many domains,
the rest as ``other``), ``METRICS_LINGER`` (0: seconds to keep serving after the spider
closed, so that a short job's final counts are scraped).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.exposition import start_http_server
from scrapy import signals
from scrapy.exceptions import NotConfigured

from ..backends.embedded import data_dir, project_root
from ..backends.redis_client import get_redis
from ..config import get_bool, get_float, get_int
from ..item_observers import on_item_scraped, on_response_received
from ..quality.metrics import QualityCollector
from ..runs.metrics import RunCollector
from ..runtime import procs
from .collector import CrawlCollector, queue_reader

logger = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
PIPELINE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class MetricsExporter:
    def __init__(self, crawler: Any) -> None:
        settings = crawler.settings
        self.crawler = crawler
        self.bind = str(settings.get("METRICS_BIND") or "127.0.0.1")
        self.port = get_int(settings, "METRICS_PORT", 9410, minimum=0)
        self.port_range = get_int(settings, "METRICS_PORT_RANGE", 50, minimum=1)
        self.max_domains = get_int(settings, "METRICS_MAX_DOMAINS", 50, minimum=0)
        self.linger = get_float(settings, "METRICS_LINGER", 0.0, minimum=0)
        sd_dir = settings.get("METRICS_FILE_SD_DIR")
        if sd_dir is None:
            sd_dir = str(data_dir(settings) / "metrics-targets")
        self.sd_dir = project_root() / sd_dir if sd_dir else None
        self.announce = get_bool(settings, "METRICS_ANNOUNCE", False)
        # Prometheus keeps scraping a target for a few seconds after its file is gone: a port
        # just freed by a dead process is not taken again, or those scrapes would count us twice.
        self.avoid_ports: set[int] = set()
        if self.sd_dir is not None:
            self.avoid_ports = {int(p.stem.rsplit("-", 1)[1]) for p in sweep_targets(self.sd_dir)}

        self.registry = CollectorRegistry()
        self.collector = CrawlCollector(crawler, queue_reader(crawler, get_redis(settings["REDIS_URL"])))
        self.registry.register(self.collector)
        self.registry.register(RunCollector(crawler, get_redis(settings["REDIS_URL"])))
        self.registry.register(QualityCollector(crawler, get_redis(settings["REDIS_URL"])))
        ProcessCollector(registry=self.registry)
        self.latency = Histogram(
            "scraper_download_latency_seconds",
            "Time to download a page.",
            ["spider", "domain"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.pipeline_time = Histogram(
            "scraper_pipeline_seconds",
            "Time from an item's yield to its commit.",
            ["spider"],
            buckets=PIPELINE_BUCKETS,
            registry=self.registry,
        )
        self._domains: set[str] = set()
        # Per URL's netloc part: its host; per (spider, domain): the histogram's child. Both are
        # looked up for every page, and parsing the URL or resolving labels cost more than that.
        self._hosts: dict[str, str] = {}
        self._latency_children: dict[tuple[str, str], Any] = {}
        self._pipeline_children: dict[str, Any] = {}
        self.httpd: Any = None
        self.bound_port = 0
        self.target_file: Path | None = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> MetricsExporter:
        if not get_bool(crawler.settings, "METRICS_ENABLED", True):
            raise NotConfigured
        ext = cls(crawler)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        on_response_received(crawler, ext.response_received)
        on_item_scraped(crawler, ext.item_scraped)
        return ext

    # --- lifecycle ----------------------------------------------------------------------------
    def spider_opened(self, spider: Any) -> None:
        self.collector.spider_open = True
        self._serve()
        if self.httpd is not None and self.sd_dir is not None and self.announce:
            self._announce()

    async def spider_closed(self, spider: Any) -> None:
        self.collector.spider_open = False
        if self.linger and self.httpd is not None:
            logger.info("Serving final metrics for %.0f s more", self.linger)
            await asyncio.sleep(self.linger)
        self._withdraw()
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def _serve(self) -> None:
        ports = [0] if self.port == 0 else range(self.port, self.port + self.port_range)
        for port in ports:
            if port in self.avoid_ports:
                continue
            try:
                self.httpd, _thread = start_http_server(port, addr=self.bind, registry=self.registry)
            except OSError:
                continue
            self.bound_port = self.httpd.server_port
            logger.info("Metrics at http://%s:%d/metrics", self.bind, self.bound_port)
            return
        logger.warning(
            "No free port for metrics in %d-%d on %s: this process exports none (METRICS_PORT, METRICS_PORT_RANGE)",
            self.port,
            self.port + self.port_range - 1,
            self.bind,
        )

    def _announce(self) -> None:
        host = self.bind if self.bind not in ("0.0.0.0", "::", "") else socket.gethostname()
        target = [
            {
                "targets": [f"{host}:{self.bound_port}"],
                # Not "spider": the metrics carry it, and a target label of the same name would
                # push theirs aside as exported_spider.
                "labels": {"node": f"{socket.gethostname()}:{os.getpid()}"},
            }
        ]
        try:
            self.sd_dir.mkdir(parents=True, exist_ok=True)
            path = self.sd_dir / f"{socket.gethostname()}-{os.getpid()}-{self.bound_port}.json"
            # Written aside then renamed: Prometheus must never read half a file.
            temp = path.with_suffix(".tmp")
            temp.write_text(json.dumps(target))
            temp.replace(path)
            self.target_file = path
            atexit.register(self._withdraw)  # whatever way the process ends short of SIGKILL
        except OSError as exc:
            logger.warning("Could not write the Prometheus target file in %s: %s", self.sd_dir, exc)

    def _withdraw(self) -> None:
        if self.target_file is not None:
            self.target_file.unlink(missing_ok=True)
            self.target_file = None

    # --- observations -------------------------------------------------------------------------
    def response_received(self, response: Any, request: Any) -> None:
        self.collector.last_response = time.time()
        latency = request.meta.get("download_latency")
        if latency is not None:
            labels = (self.crawler.spider.name, self._domain(response.url))
            child = self._latency_children.get(labels)
            if child is None:
                child = self._latency_children[labels] = self.latency.labels(*labels)
            child.observe(latency)

    def item_scraped(self, item: Any) -> None:
        yielded = getattr(item, "_yielded_at", None)
        if yielded is not None:
            name = self.crawler.spider.name
            child = self._pipeline_children.get(name)
            if child is None:
                child = self._pipeline_children[name] = self.pipeline_time.labels(name)
            child.observe(time.monotonic() - yielded)

    def _domain(self, url: str) -> str:
        # The host only depends on what precedes the path, so URLs of one site share an entry.
        parts = url.split("/", 3)
        netloc = parts[2] if len(parts) > 2 and parts[1] == "" and parts[0].endswith(":") else None
        host = self._hosts.get(netloc) if netloc is not None else None
        if host is None:
            host = urlsplit(url).hostname or "unknown"
            if netloc is not None and len(self._hosts) < 10_000:
                self._hosts[netloc] = host
        if host in self._domains:
            return host
        if len(self._domains) < self.max_domains:
            self._domains.add(host)
            return host
        return "other"


def sweep_targets(folder: Path) -> list[Path]:
    """Remove the target files of this host's processes that are gone; returns them.

    A file is named ``<host>-<pid>-<port>.json``; its process is gone if the pid does not run,
    or runs but started after the file was written (the pid was reused)."""
    host = socket.gethostname()
    removed = []
    try:
        files = list(folder.glob(f"{host}-*-*.json"))
    except OSError:
        return removed
    for path in files:
        name_host, pid, _port = path.stem.rsplit("-", 2)
        if name_host != host or not pid.isdigit():
            continue
        try:
            written = path.stat().st_mtime
        except OSError:
            continue
        if not procs.is_alive(int(pid), written_at=written):
            path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        logger.info("Removed %d metrics target file(s) of processes that are gone from %s", len(removed), folder)
    return removed
