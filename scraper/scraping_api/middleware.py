"""Send requests through a scraping API; hand the spider the *target's* response.

How a request travels (``SCRAPING_API_*`` settings, documented in ``scraper/settings.py``):

1. The spider's request is scheduled as usual (the shared queue and the seen-set only ever see
   the target URL) and reaches this middleware's ``process_request``.
2. For a domain routed to the API, the middleware builds the API call (provider-specific, with
   the key in its header) and sends it through Scrapy's downloader itself, with
   ``meta["download_slot"]`` set to the target's slot: per-domain concurrency, ``DOWNLOAD_DELAY``,
   AutoThrottle and ``DOWNLOAD_TIMEOUT`` apply to it as to a direct fetch. The API call is never
   handed back to the engine, so it never reaches the scheduler, the Redis queue or a log line
   with its headers. (A Request *returned* from ``process_request`` would be: Scrapy schedules it.)
3. Retries of 429/5xx/timeouts (honouring ``Retry-After``), polling of ``202`` jobs and the
   resubmission of expired jobs happen inside the same coroutine, with reactor timers, never a
   blocking sleep, bounded by ``SCRAPING_API_MAX_RETRIES``.
4. The result becomes an ordinary Response for the target URL (target status, headers and body),
   flagged ``scraping_api``: Scrapy's RetryMiddleware, HttpError and the spider treat a target
   4xx/5xx as they would a direct one.

401/403 from the API close the spider with ``scraping_api_auth``, 402 with
``scraping_api_credits``, an exhausted budget with ``scraping_api_budget``; the request in hand
is put back into the shared queue first, so nothing is lost and the next run resumes.
"""

from __future__ import annotations

import logging
import random
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator
from urllib.parse import urlsplit

from scrapy import Request, signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Headers, Response
from scrapy.responsetypes import responsetypes
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred, DeferredSemaphore

from ..config import ConfigError, get_choice, get_float, get_int
from ..middlewares.requeue import requeue
from ..secrets import install_log_redaction, redact, register_secret
from .budget import Budget
from .providers import PROVIDERS, ApiCall, ApiError, Expired, Job, Provider, Result, Target
from .routing import (
    DEFAULT_BLOCK_PATTERN,
    ROUTES,
    compile_pattern,
    parse_routing,
    parse_statuses,
    route_for,
)

logger = logging.getLogger(__name__)

#: meta key marking the middleware's own API calls (they pass through the downloader again).
API_CALL = "_scraping_api_call"
#: meta key of per-request options; ``False`` fetches this request directly.
OPTIONS_META = "scraping_api"
FLAG = "scraping_api"

STOP_AUTH = "scraping_api_auth"
STOP_CREDITS = "scraping_api_credits"
STOP_BUDGET = "scraping_api_budget"

# Request headers worth forwarding to the target by default; the API picks its own user agent
# and accept headers. More with the ``forward_headers`` option, or ``headers`` verbatim.
FORWARDED_HEADERS = ("Cookie", "Content-Type", "Authorization")


class ScrapingApiError(Exception):
    """The API could not deliver the page. The message never holds the key."""


def get_settings(settings: Any) -> dict[str, Any]:
    """Read and check every ``SCRAPING_API_*`` setting; raise ConfigError naming a bad one."""
    provider = get_choice(settings, "SCRAPING_API_PROVIDER", "alterlab", tuple(PROVIDERS))
    base_url = str(settings.get("SCRAPING_API_URL") or PROVIDERS[provider].default_url).strip()
    if urlsplit(base_url).scheme not in ("http", "https") or not urlsplit(base_url).hostname:
        raise ConfigError(f"SCRAPING_API_URL: expected an http(s) URL, got {redact(base_url)!r}")
    options = settings.get("SCRAPING_API_OPTIONS") or {}
    if not isinstance(options, dict):
        try:
            options = settings.getdict("SCRAPING_API_OPTIONS")
        except ValueError:
            raise ConfigError(f"SCRAPING_API_OPTIONS: expected a JSON object, got {options!r}") from None
    return {
        "key": str(settings.get("SCRAPING_API_KEY") or "").strip(),
        "provider": provider,
        "base_url": base_url,
        "budget": get_float(settings, "SCRAPING_API_BUDGET", 0.0, minimum=0),
        "routing": parse_routing(settings.get("SCRAPING_API_ROUTING") or ""),
        "default_route": get_choice(settings, "SCRAPING_API_DEFAULT_ROUTE", "always", ROUTES),
        "max_retries": get_int(settings, "SCRAPING_API_MAX_RETRIES", 5, minimum=0),
        "retry_backoff": get_float(settings, "SCRAPING_API_RETRY_BACKOFF", 1.0, minimum=0),
        "retry_max_delay": get_float(settings, "SCRAPING_API_RETRY_MAX_DELAY", 60.0, minimum=0),
        "poll_interval": get_float(settings, "SCRAPING_API_POLL_INTERVAL", 1.0, minimum=0.01),
        "poll_max_interval": get_float(settings, "SCRAPING_API_POLL_MAX_INTERVAL", 10.0, minimum=0.01),
        "job_timeout": get_float(settings, "SCRAPING_API_JOB_TIMEOUT", 600.0, minimum=0.1),
        "block_statuses": parse_statuses(settings.get("SCRAPING_API_BLOCK_STATUSES", "403,429")),
        "block_pattern": compile_pattern(settings.get("SCRAPING_API_BLOCK_PATTERN", DEFAULT_BLOCK_PATTERN)),
        "options": dict(options),
    }


def merge_options(*layers: Any) -> dict[str, Any]:
    """Settings' options, then the spider's ``scraping_api`` dict, then the request's meta win."""
    options: dict[str, Any] = {}
    for layer in layers:
        if isinstance(layer, dict):
            options.update(layer)
    return options


class ScrapingApiMiddleware:
    def __init__(self, crawler: Any, conf: dict[str, Any]) -> None:
        self.crawler = crawler
        self.provider: Provider = PROVIDERS[conf["provider"]](conf["key"], conf["base_url"])
        self.conf = conf
        self.budget = Budget(conf["budget"])
        self.escalated: set[str] = set()
        self.stopping: str | None = None
        self._sleepers: set[Any] = set()
        self._limits: dict[str, DeferredSemaphore] = {}
        self.stats = crawler.stats

    @classmethod
    def from_crawler(cls, crawler: Any) -> "ScrapingApiMiddleware":
        conf = get_settings(crawler.settings)
        if not conf["key"]:
            raise NotConfigured("SCRAPING_API_KEY is not set: fetching directly")
        install_log_redaction()
        register_secret(conf["key"])
        mw = cls(crawler, conf)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    def __repr__(self) -> str:
        return f"<ScrapingApiMiddleware {self.provider!r}>"

    # -- signals -----------------------------------------------------------------------------

    def spider_opened(self, spider: Any) -> None:
        if self.budget.limit:
            self.stats.set_value("scraping_api/budget", self.budget.limit)
        routing = ", ".join(f"{d}={r}" for d, r in self.conf["routing"].items()) or "none"
        logger.info(
            "Fetching through the %s API at %s (default route %s; per-domain routes: %s; budget: %s)",
            self.provider.name, self.provider.base_url, self.conf["default_route"], routing,
            self.budget.limit or "none",
        )

    def spider_closed(self, spider: Any, reason: str) -> None:
        if not self.stopping:
            self.stopping = reason or "closed"
        self._wake_sleepers()

    # -- the two hooks -----------------------------------------------------------------------

    async def process_request(self, request: Request) -> Response | None:
        if request.meta.get(API_CALL) or not self._routable(request):
            return None
        route = self._route(request)
        if route == "never" or (route == "on_block" and self._host(request) not in self.escalated):
            return None
        return await self._fetch(request)

    async def process_response(self, request: Request, response: Response) -> Response:
        if request.meta.get(API_CALL) or FLAG in response.flags or not self._routable(request):
            return response
        if self._route(request) != "on_block" or not self._blocked(response):
            return response
        host = self._host(request)
        if host not in self.escalated:
            self.escalated.add(host)
            self.stats.inc_value("scraping_api/escalated_domains")
            logger.info("%s answered %s like a block: fetching it through the API from now on",
                        host, response.status)
        self.stats.inc_value("scraping_api/escalated_requests")
        return await self._fetch(request)

    # -- routing -----------------------------------------------------------------------------

    @staticmethod
    def _host(request: Request) -> str:
        return (urlparse_cached(request).hostname or "").lower()

    @staticmethod
    def _routable(request: Request) -> bool:
        return urlparse_cached(request).scheme in ("http", "https") and request.meta.get(OPTIONS_META) is not False

    def _route(self, request: Request) -> str:
        return route_for(self._host(request), self.conf["routing"], self.conf["default_route"])

    def _blocked(self, response: Response) -> bool:
        if response.status in self.conf["block_statuses"]:
            return True
        pattern = self.conf["block_pattern"]
        return bool(pattern and pattern.search(response.body[:65536]))

    def _options(self, request: Request) -> dict[str, Any]:
        return merge_options(self.conf["options"], getattr(self.crawler.spider, "scraping_api", None),
                             request.meta.get(OPTIONS_META))

    # -- fetching through the API ------------------------------------------------------------

    async def _fetch(self, request: Request) -> Response:
        options = self._options(request)
        estimate = self.budget.estimate(self.provider.estimate(options))
        self._raise_if_stopping(request)
        if not self.budget.try_reserve(estimate):
            logger.info(
                "Scraping-API budget reached: %.1f credits spent, %.1f reserved by requests in flight, "
                "next request estimated at %.1f, budget %.1f",
                self.budget.spent, self.budget.reserved, estimate, self.budget.limit,
            )
            self._stop(STOP_BUDGET, request)
        started = time.monotonic()
        try:
            result = await self._fetch_result(request, options)
        finally:
            self.budget.release(estimate)
        # What the downloader would have recorded: the latency metrics stay per target domain.
        request.meta["download_latency"] = time.monotonic() - started
        return self._to_response(request, result)

    async def _fetch_result(self, request: Request, options: dict[str, Any]) -> Result:
        target = Target(request.url, request.method, self._forwarded_headers(request, options), request.body)
        slot = self.crawler.engine.downloader.get_slot_key(request)
        retries = 0
        resubmits = 0
        while True:
            self._raise_if_stopping(request)
            outcome = await self._call(self.provider.build_request(target, options), slot, request)
            if isinstance(outcome, Job):
                self.stats.inc_value("scraping_api/jobs")
                outcome = await self._wait_for_job(outcome, request)
                if isinstance(outcome, Expired):
                    resubmits += 1
                    self.stats.inc_value("scraping_api/jobs_expired")
                    if resubmits > self.conf["max_retries"]:
                        raise ScrapingApiError(f"job for {request.url} expired {resubmits} times")
                    logger.info("Job for %s expired before its result was fetched: resubmitting", request.url)
                    continue
            if isinstance(outcome, Result):
                self._count_credits(request, outcome.credits)
                return outcome
            assert isinstance(outcome, ApiError)
            delay = self._on_error(outcome, request, retries)
            retries += 1
            await self._sleep(delay)

    async def _wait_for_job(self, job: Job, request: Request) -> Result | Expired | ApiError:
        interval = self.conf["poll_interval"]
        delay = job.retry_after if job.retry_after is not None else interval
        waited = 0.0
        errors = 0
        while True:
            if waited > self.conf["job_timeout"]:
                raise ScrapingApiError(f"job for {request.url} not done after {waited:.0f} s")
            await self._sleep(delay)
            waited += delay
            self._raise_if_stopping(request)
            self.stats.inc_value("scraping_api/polls")
            call = self.provider.poll_request(job.job_id)
            outcome = await self._call(call, f"scraping_api:{urlsplit(call.url).netloc}", request, job.job_id)
            if isinstance(outcome, Job):
                interval = min(interval * 1.5, self.conf["poll_max_interval"])
                delay = outcome.retry_after if outcome.retry_after is not None else interval
                continue
            if isinstance(outcome, ApiError) and outcome.retryable:
                delay = self._on_error(outcome, request, errors)
                errors += 1
                continue
            return outcome

    async def _call(self, call: ApiCall, slot: str, request: Request, job_id: str | None = None) -> Any:
        """Send one API call through the downloader; an exception becomes a retryable ApiError."""
        api_request = Request(
            call.url,
            method=call.method,
            headers=call.headers,
            body=call.body,
            dont_filter=True,
            priority=request.priority,
            meta={
                API_CALL: True,
                "download_slot": slot,
                "dont_retry": True,
                "dont_redirect": True,
                "dont_merge_cookies": True,
                "dont_obey_robotstxt": True,
                "dont_cache": True,
                "allow_offsite": True,
                "handle_httpstatus_all": True,
            },
        )
        self.stats.inc_value("scraping_api/requests")
        try:
            async with self._slot_limit(slot):
                response = await maybe_deferred_to_future(self.crawler.engine.downloader.fetch(api_request))
        except Exception as exc:  # timeouts, refused connections, DNS: the API did not answer
            self.stats.inc_value(f"scraping_api/errors/{type(exc).__name__}")
            return ApiError(599, f"{type(exc).__name__}: {redact(str(exc))[:300]}")
        if not isinstance(response, Response):
            return ApiError(599, "the downloader returned a request instead of the API's answer")
        self.stats.inc_value(f"scraping_api/response_status_count/{response.status}")
        if job_id is not None:
            return self.provider.parse_poll(response.status, response.headers, response.body, job_id)
        return self.provider.parse_response(response.status, response.headers, response.body)

    @asynccontextmanager
    async def _slot_limit(self, slot: str) -> AsyncIterator[None]:
        """At most the slot's concurrency of API calls at once per target slot.

        The downloader's slot should enforce this by itself, but with the asyncio reactor
        Scrapy 2.19 starts queued downloads as tasks and counts them as transferring only once
        they run, so a burst of requests queued in one tick all start together (measured: 13 at
        once with CONCURRENT_REQUESTS_PER_DOMAIN=3). Our calls queue up in bursts (every waiting
        coroutine resumes at once), so the middleware holds them back itself.
        """
        semaphore = self._limits.get(slot)
        if semaphore is None:
            downloader = self.crawler.engine.downloader
            concurrency = downloader.per_slot_settings.get(slot, {}).get(
                "concurrency", downloader.ip_concurrency or downloader.domain_concurrency
            )
            semaphore = self._limits[slot] = DeferredSemaphore(max(1, int(concurrency)))
        await maybe_deferred_to_future(semaphore.acquire())
        try:
            yield
        finally:
            semaphore.release()

    def _on_error(self, error: ApiError, request: Request, retries: int) -> float:
        """Stop the crawl, give up on this request, or return how long to wait before a retry."""
        if error.status in (401, 403):
            logger.error("The scraping API refused the key (%s: %s): closing the spider", error.status, error.detail)
            self._stop(STOP_AUTH, request)
        if error.status == 402:
            logger.error("The scraping API has no credits left (402: %s): closing the spider", error.detail)
            self._stop(STOP_CREDITS, request)
        if not error.retryable:
            self.stats.inc_value("scraping_api/failed")
            raise ScrapingApiError(f"scraping API answered {error.status} for {request.url}: {error.detail}")
        if retries >= self.conf["max_retries"]:
            self.stats.inc_value("scraping_api/failed")
            self.stats.inc_value("scraping_api/retries/max_reached")
            raise ScrapingApiError(
                f"scraping API failed {retries + 1} times for {request.url}; last: {error.status} {error.detail}"
            )
        backoff = self.conf["retry_backoff"] * (2 ** retries) * (0.5 + random.random() / 2)
        delay = min(max(backoff, error.retry_after or 0.0), self.conf["retry_max_delay"])
        if error.retry_after is not None and error.retry_after > self.conf["retry_max_delay"]:
            delay = error.retry_after  # never sooner than the API asked
        self.stats.inc_value("scraping_api/retries")
        self.stats.inc_value(f"scraping_api/retries/{error.status}")
        logger.info("Scraping API answered %s for %s (%s); retry %d/%d in %.1f s",
                    error.status, request.url, error.detail, retries + 1, self.conf["max_retries"], delay)
        return delay

    def _forwarded_headers(self, request: Request, options: dict[str, Any]) -> dict[str, str]:
        names = list(FORWARDED_HEADERS) + list(options.get("forward_headers") or [])
        headers = {}
        for name in names:
            value = request.headers.get(name)
            if value is not None:
                headers[name] = value.decode("latin-1")
        if request.method.upper() == "GET":
            headers.pop("Content-Type", None)
        headers.update({str(k): str(v) for k, v in (options.get("headers") or {}).items()})
        return headers

    def _count_credits(self, request: Request, credits: float) -> None:
        self.budget.spend(credits)
        self.stats.inc_value("scraping_api/pages")
        value = int(credits) if float(credits).is_integer() else credits
        self.stats.inc_value("scraping_api/credits", value)
        self.stats.inc_value(f"scraping_api/credits/{self._host(request)}", value)

    def _to_response(self, request: Request, result: Result) -> Response:
        headers = Headers()
        for name, value in result.headers:
            headers.appendlist(name, value)
        url = result.url if urlsplit(result.url).scheme in ("http", "https") else request.url
        cls = responsetypes.from_args(headers=headers, url=url, body=result.body)
        return cls(url=url, status=result.status, headers=headers, body=result.body,
                   request=request, flags=[FLAG])

    # -- stopping and waiting ----------------------------------------------------------------

    def _raise_if_stopping(self, request: Request) -> None:
        if self.stopping:
            self._requeue(request)
            raise IgnoreRequest(f"scraping API stopped ({self.stopping})")

    def _stop(self, reason: str, request: Request) -> None:
        """Close the spider with ``reason`` once; put ``request`` back in the queue; raise."""
        if not self.stopping:
            self.stopping = reason
            self.stats.set_value("scraping_api/stopped", reason)
            self._wake_sleepers()
            engine = self.crawler.engine
            deferred_from_coro(engine.close_spider_async(reason=reason)).addErrback(
                lambda f: logger.error("Could not close the spider: %s", f.getErrorMessage())
            )
        self._raise_if_stopping(request)

    def _requeue(self, request: Request) -> None:
        requeue(self.crawler, request, "scraping_api/requeued")

    async def _sleep(self, seconds: float) -> None:
        if seconds <= 0 or self.stopping:
            return
        from twisted.internet import reactor

        waiter: Deferred[None] = Deferred()
        call = reactor.callLater(seconds, waiter.callback, None)
        self._sleepers.add(call)
        try:
            await maybe_deferred_to_future(waiter)
        finally:
            self._sleepers.discard(call)

    def _wake_sleepers(self) -> None:
        for call in list(self._sleepers):
            if call.active():
                call.reset(0)
