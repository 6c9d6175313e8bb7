"""Send requests through a scraping API; hand the spider the *target's* response.

How a request travels (``SCRAPING_API_*`` settings, documented in ``scraper/settings.py``):

1. The spider's request is scheduled as usual (the shared queue and the seen-set only ever see
   the target URL) and reaches this middleware's ``process_request``.
2. For a domain routed to the API, the middleware builds the API call (provider-specific, with
   the key in a header) and sends it with its own private client (:mod:`.client`). The API call
   is never a Scrapy request: no other middleware, signal, extension, queue, dead letter, cache,
   archive or log line ever holds it. The target slot's concurrency and ``DOWNLOAD_DELAY`` are
   applied here.
3. Retries of 429/5xx/timeouts (honouring ``Retry-After``), retries of a blocked target with
   escalated options, polling of ``202`` jobs and the resubmission of failed or expired jobs
   happen inside the same coroutine, with reactor timers, never a blocking sleep.
4. The result becomes an ordinary Response for the target (status, headers, body, and the URL
   the target ended at), flagged ``scraping_api``: Scrapy's RetryMiddleware, HttpError and the
   spider treat a target 4xx/5xx as they would a direct one.
5. An API call that fails for good raises :class:`ScrapingApiError` for the *target* request;
   the dead-letter middleware sets the target aside with the reason ``api:<status>:<code>``.

A refused key closes the spider with ``scraping_api_auth``, an empty balance with
``scraping_api_credits``, an exhausted budget with ``scraping_api_budget``; the request in hand
is put back into the shared queue first, so nothing is lost and the next run resumes.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

from scrapy import Request, signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Headers, Response
from scrapy.responsetypes import responsetypes
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred, DeferredSemaphore

from ..backends.redis_client import UNREACHABLE, get_redis
from ..config import ConfigError, get_choice, get_float, get_int
from ..middlewares.requeue import requeue
from ..queue.keys import escalated_key
from ..runtime.secrets import install_log_redaction, redact, register_secret
from .budget import Budget, SharedBudget
from .client import ApiClient, TransportError, is_usable
from .providers import (
    AUTH,
    BLOCKED,
    CREDITS,
    FATAL,
    PROVIDERS,
    RETRY,
    ApiCall,
    ApiError,
    Expired,
    Failed,
    Job,
    OptionError,
    Provider,
    Result,
    Target,
)
from .routing import (
    DEFAULT_BLOCK_PATTERN,
    ROUTES,
    compile_pattern,
    parse_routing,
    parse_statuses,
    route_for,
)

logger = logging.getLogger(__name__)

#: meta key of per-request options; ``False`` fetches this request directly.
OPTIONS_META = "scraping_api"
#: meta key where the API's structured extraction (``extraction_result``) is handed to the spider.
EXTRACTION_META = "scraping_api_extraction"
FLAG = "scraping_api"

STOP_AUTH = "scraping_api_auth"
STOP_CREDITS = "scraping_api_credits"
STOP_BUDGET = "scraping_api_budget"

# Request headers worth forwarding to the target by default (with the validators of a conditional
# revisit, see scraper/revisit); the API picks its own user agent and accept headers. More with
# the ``forward_headers`` option, or ``headers`` verbatim.
FORWARDED_HEADERS = ("Cookie", "Content-Type", "Authorization", "If-None-Match", "If-Modified-Since")
# Options of our own that are not sent to the API as they are.
OWN_OPTIONS = frozenset({"forward_headers", "headers"})
DEFAULT_ESCALATION = ({"render_js": True},)
REPLACEMENT_CHAR = "\ufffd".encode("utf-8")
ESCALATION_REFRESH = 5.0  # seconds between reads of the run's escalated domains


class ScrapingApiError(Exception):
    """The API could not deliver the page, for good. The target request becomes a dead letter
    with ``dead_letter_reason`` (``api:<status>:<code>``). The message never holds the key."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.dead_letter_reason = reason


def _json_setting(settings: Any, name: str, default: Any, kind: type) -> Any:
    value = settings.get(name)
    if value in (None, ""):
        return default
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except ValueError:
            raise ConfigError(f"{name}: expected JSON ({kind.__name__}), got {value!r}") from None
    if not isinstance(value, kind):
        raise ConfigError(f"{name}: expected a JSON {kind.__name__}, got {value!r}")
    return value


def get_settings(settings: Any) -> dict[str, Any]:
    """Read and check every ``SCRAPING_API_*`` setting; raise ConfigError naming a bad one."""
    provider = get_choice(settings, "SCRAPING_API_PROVIDER", "alterlab", tuple(PROVIDERS))
    base_url = str(settings.get("SCRAPING_API_URL") or PROVIDERS[provider].default_url).strip()
    if urlsplit(base_url).scheme not in ("http", "https") or not urlsplit(base_url).hostname:
        raise ConfigError(f"SCRAPING_API_URL: expected an http(s) URL, got {redact(base_url)!r}")
    options = _json_setting(settings, "SCRAPING_API_OPTIONS", {}, dict)
    try:
        PROVIDERS[provider]("", base_url).check_options(options)
    except OptionError as exc:
        raise ConfigError(f"SCRAPING_API_OPTIONS: {exc}") from None
    escalation = _json_setting(settings, "SCRAPING_API_BLOCKED_ESCALATION", list(DEFAULT_ESCALATION), list)
    for step in escalation:
        if not isinstance(step, dict):
            raise ConfigError(f"SCRAPING_API_BLOCKED_ESCALATION: expected a list of option objects, got {step!r}")
        try:
            PROVIDERS[provider]("", base_url).check_options(step)
        except OptionError as exc:
            raise ConfigError(f"SCRAPING_API_BLOCKED_ESCALATION: {exc}") from None
    return {
        "key": str(settings.get("SCRAPING_API_KEY") or "").strip(),
        "provider": provider,
        "base_url": base_url,
        "budget": get_float(settings, "SCRAPING_API_BUDGET", 0.0, minimum=0),
        "routing": parse_routing(settings.get("SCRAPING_API_ROUTING") or ""),
        "default_route": get_choice(settings, "SCRAPING_API_DEFAULT_ROUTE", "always", ROUTES),
        "robotstxt": get_choice(settings, "SCRAPING_API_ROBOTSTXT", "direct", ("direct", "api")),
        "max_retries": get_int(settings, "SCRAPING_API_MAX_RETRIES", 5, minimum=0),
        "blocked_retries": get_int(settings, "SCRAPING_API_BLOCKED_RETRIES", 2, minimum=0),
        "escalation": [dict(step) for step in escalation],
        "retry_backoff": get_float(settings, "SCRAPING_API_RETRY_BACKOFF", 1.0, minimum=0),
        "retry_max_delay": get_float(settings, "SCRAPING_API_RETRY_MAX_DELAY", 60.0, minimum=0),
        "poll_interval": get_float(settings, "SCRAPING_API_POLL_INTERVAL", 1.0, minimum=0.01),
        "poll_max_interval": get_float(settings, "SCRAPING_API_POLL_MAX_INTERVAL", 10.0, minimum=0.01),
        "job_timeout": get_float(settings, "SCRAPING_API_JOB_TIMEOUT", 600.0, minimum=0.1),
        "download_timeout": get_float(settings, "DOWNLOAD_TIMEOUT"),
        "download_delay": get_float(settings, "DOWNLOAD_DELAY", 0.0, minimum=0),
        "max_size": get_int(settings, "DOWNLOAD_MAXSIZE"),
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


def server_timeout(client_timeout: float) -> float:
    """The timeout the API is asked to keep: below ours, so the API gives up (and, for most
    providers, does not bill) before we cut the call and pay for a retry."""
    return max(1.0, client_timeout - max(2.0, client_timeout * 0.1))


class ScrapingApiMiddleware:
    def __init__(self, crawler: Any, conf: dict[str, Any]) -> None:
        self.crawler = crawler
        self.provider: Provider = PROVIDERS[conf["provider"]](conf["key"], conf["base_url"])
        self.conf = conf
        self.budget: Budget = Budget(conf["budget"])
        self.shared: Any = None  # Redis, when this process is a node of a shared crawl
        self.client = ApiClient(
            max_connections=get_int(crawler.settings, "CONCURRENT_REQUESTS"),
            max_size=conf["max_size"],
            user_agent=f"scraper/{self.provider.name}",
        )
        self.escalated: set[str] = set()
        self.damaged_hosts: set[str] = set()
        self.stopping: str | None = None
        self._sleepers: set[Any] = set()
        self._limits: dict[str, DeferredSemaphore] = {}
        self._next_start: dict[str, float] = {}
        self._wrong_url_logged = False
        self._escalated_read = float("-inf")
        self.stats = crawler.stats

    @classmethod
    def from_crawler(cls, crawler: Any) -> ScrapingApiMiddleware:
        conf = get_settings(crawler.settings)
        if not conf["key"]:
            raise NotConfigured("SCRAPING_API_KEY is not set: fetching directly")
        if not is_usable():
            raise ConfigError(
                "SCRAPING_API_KEY: the scraping-API client needs Scrapy's asyncio reactor "
                "(TWISTED_REACTOR = twisted.internet.asyncioreactor.AsyncioSelectorReactor)"
            )
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
        if self._shares_state():
            self.shared = get_redis(self.crawler.settings["REDIS_URL"])
            self.escalation_key = escalated_key(spider.name)
            if self.budget.limit:
                self.budget = SharedBudget(self.shared, spider.name, self.budget.limit)
            self._refresh_escalated(force=True)
        spider_options = getattr(spider, "scraping_api", None)
        if isinstance(spider_options, dict):
            try:
                self.provider.check_options(spider_options)
            except OptionError as exc:
                logger.error("%s.scraping_api: %s: closing the spider", type(spider).__name__, exc)
                deferred_from_coro(self.crawler.engine.close_spider_async(reason="scraping_api_options"))
        if self.budget.limit:
            self.stats.set_value("scraping_api/budget", self.budget.limit)
        routing = ", ".join(f"{d}={r}" for d, r in self.conf["routing"].items()) or "none"
        logger.info(
            "Fetching through the %s API at %s (default route %s; per-domain routes: %s; budget: %s %s; "
            "robots.txt: %s)",
            self.provider.name,
            self.provider.base_url,
            self.conf["default_route"],
            routing,
            self.budget.limit or "none",
            self.provider.unit,
            self.conf["robotstxt"],
        )

    async def spider_closed(self, spider: Any, reason: str) -> None:
        if not self.stopping:
            self.stopping = reason or "closed"
        self._wake_sleepers()
        await self.client.close()

    # -- the two hooks -----------------------------------------------------------------------

    async def process_request(self, request: Request) -> Response | None:
        if not self._routable(request):
            return None
        route = self._route(request)
        if route == "on_block":
            self._refresh_escalated()
        if route == "never" or (route == "on_block" and self._host(request) not in self.escalated):
            return None
        return await self._fetch(request)

    async def process_response(self, request: Request, response: Response) -> Response:
        if FLAG in response.flags or not self._routable(request):
            return response
        if self._route(request) != "on_block" or not self._blocked(response):
            return response
        host = self._host(request)
        if host not in self.escalated:
            self.escalated.add(host)
            self.stats.inc_value("scraping_api/escalated_domains")
            logger.info(
                "%s answered %s like a block: fetching it through the API from now on, on every worker",
                host,
                response.status,
            )
            if self.shared is not None:
                try:
                    self.shared.sadd(self.escalation_key, host)
                except UNREACHABLE:
                    pass  # this worker escalates it; the others find out on their own
        self.stats.inc_value("scraping_api/escalated_requests")
        return await self._fetch(request)

    # -- routing -----------------------------------------------------------------------------

    @staticmethod
    def _host(request: Request) -> str:
        return (urlparse_cached(request).hostname or "").lower()

    def _routable(self, request: Request) -> bool:
        url = urlparse_cached(request)
        if url.scheme not in ("http", "https") or request.meta.get(OPTIONS_META) is False:
            return False
        # robots.txt is the site's own rule file: fetching it through the API would cost a page
        # (five with render_js) and tell the API's crawler, not ours, what it may fetch.
        return not (
            self.conf["robotstxt"] == "direct" and url.path == "/robots.txt" and request.meta.get("dont_obey_robotstxt")
        )

    def _shares_state(self) -> bool:
        """A node of a shared crawl (our scheduler), not a developer command on its own."""
        scheduler = str(self.crawler.settings.get("SCHEDULER") or "")
        return scheduler.endswith("SharedScheduler") and bool(self.crawler.settings.get("REDIS_URL"))

    def _refresh_escalated(self, force: bool = False) -> None:
        """Learn the domains other workers escalated in this run (at most every few seconds)."""
        now = time.monotonic()
        if self.shared is None or (not force and now - self._escalated_read < ESCALATION_REFRESH):
            return
        self._escalated_read = now
        try:
            found = {m.decode() if isinstance(m, bytes) else m for m in self.shared.smembers(self.escalation_key)}
        except UNREACHABLE:
            return
        new = found - self.escalated
        if new:
            self.escalated |= new
            logger.info("Fetching %s through the API: escalated by another worker of this run", ", ".join(sorted(new)))

    def _route(self, request: Request) -> str:
        return route_for(self._host(request), self.conf["routing"], self.conf["default_route"])

    def _blocked(self, response: Response) -> bool:
        if response.status in self.conf["block_statuses"]:
            return True
        pattern = self.conf["block_pattern"]
        return bool(pattern and pattern.search(response.body[:65536]))

    def _options(self, request: Request) -> dict[str, Any]:
        return merge_options(
            self.conf["options"], getattr(self.crawler.spider, "scraping_api", None), request.meta.get(OPTIONS_META)
        )

    # -- fetching through the API ------------------------------------------------------------

    async def _fetch(self, request: Request) -> Response:
        options = self._options(request)
        try:
            self.provider.check_options(options)
        except OptionError as exc:
            raise ScrapingApiError("api:options", f"{request.url}: {exc}") from None
        estimate = self.budget.estimate(self.provider.estimate(options))
        self._raise_if_stopping(request)
        timeout = float(request.meta.get("download_timeout") or self.conf["download_timeout"])
        reservation = self.budget.reserve(
            estimate, hold_seconds=self.conf["job_timeout"] + timeout * (self.conf["max_retries"] + 2)
        )
        if reservation is None:
            logger.info(
                "Scraping-API budget reached: %.1f %s spent in this run by every worker, %.1f reserved by calls "
                "in flight, next call estimated at %.1f, budget %.1f. Raise SCRAPING_API_BUDGET to go on; "
                "the queue is kept",
                self.budget.spent,
                self.provider.unit,
                self.budget.reserved,
                estimate,
                self.budget.limit,
            )
            self._stop(STOP_BUDGET, request)
        started = time.monotonic()
        billed = 0.0
        try:
            result = await self._fetch_result(request, options)
            billed = result.credits
        finally:
            if reservation is not None:
                self.budget.settle(reservation, billed)
            # The run's spending across the fleet as this worker last saw it (its own without a budget).
            self.stats.set_value("scraping_api/run_spent", self.budget.spent)
        # What the downloader would have recorded: the latency metrics stay per target domain.
        request.meta["download_latency"] = time.monotonic() - started
        return self._to_response(request, result)

    async def _fetch_result(self, request: Request, options: dict[str, Any]) -> Result:
        target = Target(request.url, request.method, self._forwarded_headers(request, options), request.body)
        slot = self.crawler.engine.downloader.get_slot_key(request)
        timeout = float(request.meta.get("download_timeout") or self.conf["download_timeout"])
        sent = {k: v for k, v in options.items() if k not in OWN_OPTIONS}
        retries = resubmits = blocked = 0
        while True:
            self._raise_if_stopping(request)
            try:
                call = self.provider.build_request(target, sent, server_timeout(timeout))
            except OptionError as exc:
                raise ScrapingApiError("api:options", f"{request.url}: {exc}") from None
            outcome = await self._call(call, slot, request, timeout)
            if isinstance(outcome, Job):
                self.stats.inc_value("scraping_api/jobs")
                outcome = await self._wait_for_job(outcome, request, timeout)
            if isinstance(outcome, (Expired, Failed)):
                what = "expired" if isinstance(outcome, Expired) else "failed"
                resubmits += 1
                self.stats.inc_value(f"scraping_api/jobs_{what}")
                if resubmits > self.conf["max_retries"]:
                    self.stats.inc_value("scraping_api/failed")
                    raise ScrapingApiError(f"api:job:{what}", f"the job for {request.url} {what} {resubmits} times")
                logger.info(
                    "The API's job for %s %s%s: submitting it again",
                    request.url,
                    what,
                    f" ({outcome.detail})" if isinstance(outcome, Failed) else "",
                )
                continue
            if isinstance(outcome, Result):
                self._count_credits(request, outcome.credits)
                return outcome
            assert isinstance(outcome, ApiError)
            if outcome.kind == BLOCKED:
                blocked += 1
                if blocked > self.conf["blocked_retries"]:
                    self._fail(outcome, request, blocked)
                sent = self._escalate(sent, blocked)
                self.stats.inc_value("scraping_api/blocked_retries")
                logger.info(
                    "The API says %s blocked it (%s %s): retry %d/%d with %s",
                    request.url,
                    outcome.status,
                    outcome.code,
                    blocked,
                    self.conf["blocked_retries"],
                    self.conf["escalation"][min(blocked, len(self.conf["escalation"])) - 1]
                    if self.conf["escalation"]
                    else "the same options",
                )
                continue
            delay = self._on_error(outcome, request, retries)
            retries += 1
            await self._sleep(delay)

    def _escalate(self, options: dict[str, Any], step: int) -> dict[str, Any]:
        """Options for blocked retry number *step*: the escalation steps so far, applied in order."""
        escalated = dict(options)
        for layer in self.conf["escalation"][:step]:
            escalated.update(layer)
        return escalated

    async def _wait_for_job(self, job: Job, request: Request, timeout: float) -> Result | Expired | Failed | ApiError:
        interval = self.conf["poll_interval"]
        delay = job.retry_after if job.retry_after is not None else interval
        waited = 0.0
        errors = 0
        while True:
            if waited > self.conf["job_timeout"]:
                self.stats.inc_value("scraping_api/failed")
                raise ScrapingApiError(
                    "api:job:timeout", f"the job for {request.url} was not done after {waited:.0f} s"
                )
            await self._sleep(delay)
            waited += delay
            self._raise_if_stopping(request)
            self.stats.inc_value("scraping_api/polls")
            call = self.provider.poll_request(job.job_id)
            outcome = await self._call(call, f"scraping_api:{urlsplit(call.url).netloc}", request, timeout, job.job_id)
            if isinstance(outcome, Job):
                interval = min(interval * 1.5, self.conf["poll_max_interval"])
                delay = outcome.retry_after if outcome.retry_after is not None else interval
                continue
            if isinstance(outcome, ApiError) and outcome.retryable and outcome.kind != BLOCKED:
                delay = self._on_error(outcome, request, errors)
                errors += 1
                continue
            return outcome

    async def _call(self, call: ApiCall, slot: str, request: Request, timeout: float, job_id: str | None = None) -> Any:
        """Send one API call with the private client; no answer becomes a retryable ApiError."""
        self.stats.inc_value("scraping_api/requests")
        try:
            async with self._slot_limit(slot, polling=job_id is not None):
                answer = await self.client.send(call, timeout)
        except TransportError as exc:
            self.stats.inc_value(f"scraping_api/errors/{exc.kind}")
            # An answer over DOWNLOAD_MAXSIZE would be as large the next time: not retried.
            return ApiError(599, f"{exc.kind}: {exc}", code=exc.kind, kind=FATAL if exc.kind == "too_large" else RETRY)
        self.stats.inc_value(f"scraping_api/response_status_count/{answer.status}")
        if job_id is not None:
            return self.provider.parse_poll(answer.status, answer.headers, answer.body, job_id)
        outcome = self.provider.parse_response(answer.status, answer.headers, answer.body)
        if isinstance(outcome, ApiError) and outcome.status == 404 and not self._wrong_url_logged:
            self._wrong_url_logged = True
            logger.error(
                "The scraping API answered 404 at %s: is SCRAPING_API_URL right? It is the API's base "
                "URL, without a path (%s's is %s)",
                call.url,
                self.provider.name,
                self.provider.default_url,
            )
        return outcome

    @asynccontextmanager
    async def _slot_limit(self, slot: str, polling: bool = False) -> AsyncIterator[None]:
        """At most the target slot's concurrency of API calls at once, spaced by its delay.

        API calls never enter Scrapy's downloader, so its slots do not hold them; the same
        limits are applied here, per target slot. Polls only read a job's state: they are
        limited but not delayed."""
        semaphore = self._limits.get(slot)
        downloader = self.crawler.engine.downloader
        per_slot = downloader.per_slot_settings.get(slot, {})
        if semaphore is None:
            concurrency = per_slot.get("concurrency", downloader.ip_concurrency or downloader.domain_concurrency)
            semaphore = self._limits[slot] = DeferredSemaphore(max(1, int(concurrency)))
        await maybe_deferred_to_future(semaphore.acquire())
        try:
            delay = float(per_slot.get("delay", self.conf["download_delay"]))
            if delay and not polling:
                now = time.monotonic()
                start = max(now, self._next_start.get(slot, 0.0))
                # Scrapy's RANDOMIZE_DOWNLOAD_DELAY: 0.5x to 1.5x the delay.
                self._next_start[slot] = start + delay * (0.5 + random.random())
                await self._sleep(start - now)
            yield
        finally:
            semaphore.release()

    def _fail(self, error: ApiError, request: Request, attempts: int) -> None:
        self.stats.inc_value("scraping_api/failed")
        self.stats.inc_value(f"scraping_api/failed/{error.status}")
        raise ScrapingApiError(
            error.reason,
            f"the scraping API failed {attempts} time(s) for {request.url}: "
            f"{error.status} {error.code} {error.detail}".rstrip(),
        )

    def _on_error(self, error: ApiError, request: Request, retries: int) -> float:
        """Stop the crawl, give up on this request, or return how long to wait before a retry."""
        if error.kind == AUTH:
            logger.error("The scraping API refused the key (%s: %s): closing the spider", error.status, error.detail)
            self._stop(STOP_AUTH, request)
        if error.kind == CREDITS:
            logger.error(
                "The scraping API has no credits left (%s: %s): closing the spider", error.status, error.detail
            )
            self._stop(STOP_CREDITS, request)
        if error.kind == FATAL:
            self._fail(error, request, retries + 1)
        cap = self.provider.max_attempts(error)
        if retries >= self.conf["max_retries"] or (cap is not None and retries + 1 >= cap):
            self.stats.inc_value("scraping_api/retries/max_reached")
            self._fail(error, request, retries + 1)
        backoff = self.provider.retry_delay(error, retries, self.conf["retry_backoff"])
        delay = min(max(backoff, error.retry_after or 0.0), max(self.conf["retry_max_delay"], backoff))
        if error.retry_after is not None and error.retry_after > delay:
            delay = error.retry_after  # never sooner than the API asked
        self.stats.inc_value("scraping_api/retries")
        self.stats.inc_value(f"scraping_api/retries/{error.status}")
        logger.info(
            "Scraping API answered %s for %s (%s); retry %d/%d in %.1f s",
            error.status,
            request.url,
            error.detail,
            retries + 1,
            self.conf["max_retries"],
            delay,
        )
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
        self.stats.inc_value("scraping_api/pages")
        value = int(credits) if float(credits).is_integer() else credits
        self.stats.inc_value("scraping_api/credits", value)
        self.stats.inc_value(f"scraping_api/credits/{self._host(request)}", value)

    def _to_response(self, request: Request, result: Result) -> Response:
        headers = Headers()
        for name, value in result.headers:
            headers.appendlist(name, value)
        url = result.url if urlsplit(result.url).scheme in ("http", "https") else request.url
        if result.decoded and REPLACEMENT_CHAR in result.body:
            self._damaged(request, result.body.count(REPLACEMENT_CHAR))
        if result.extraction is not None:
            request.meta[EXTRACTION_META] = result.extraction
        cls = responsetypes.from_args(headers=headers, url=url, body=result.body)
        return cls(url=url, status=result.status, headers=headers, body=result.body, request=request, flags=[FLAG])

    def _damaged(self, request: Request, count: int) -> None:
        """A page the API decoded into replacement characters lost text (and maybe a currency
        sign) before it reached us: say so, once per site, rather than store it silently."""
        self.stats.inc_value("scraping_api/damaged_text")
        host = self._host(request)
        if host not in self.damaged_hosts:
            self.damaged_hosts.add(host)
            logger.warning(
                "The %s API delivered %s with %d replacement characters (U+FFFD): it decoded the page "
                "with the wrong charset, and text is lost. Counted as scraping_api/damaged_text; "
                "pages of %s may need fetching directly (SCRAPING_API_ROUTING=%s=never)",
                self.provider.name,
                request.url,
                count,
                host,
                host,
            )

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
