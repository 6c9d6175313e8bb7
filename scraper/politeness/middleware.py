"""Hold each request until the whole fleet is within its host's limits, then let it go.

A request first takes a concurrency slot of its domain (when the domain has that limit), then a
turn under the domain's rate (when it has one), and only then continues to the later middlewares
and the downloader. In that order a turn is used the moment it comes, so waiting for a slot never
bunches up the rate. A waiting request is just a pending download: it keeps its place in
``CONCURRENT_REQUESTS`` and its time does not count against ``DOWNLOAD_TIMEOUT``.

The slot is given back exactly once per download: in ``process_response`` or
``process_exception`` (Scrapy calls them for a response a later middleware returned from
``process_request`` too, and for an exception it raised); when a request that still carries a
slot comes back (a later middleware re-issued a copy without either); or, as a last resort, when
the request object is garbage collected. A retry is a new download and takes a slot of its own.
While a slot is held its deadline in Redis is renewed, so a slow download (or a scraping-API job
that takes minutes) keeps it, and the slot of a process that died frees itself within
``HOLDER_TTL`` seconds.

Requests to one domain queue locally and only the first polls Redis for a slot, backing off from
50 ms to 500 ms (100 ms when next in line); a slot freed in this process wakes it at once.
Redis errors never drop a limit: the request waits and asks again, with a warning.

A site that answers 429 or 503 gets an adaptive rate shared by the fleet (see :mod:`.adaptive`):
the throttled request is tried again at that rate without spending Scrapy's retry budget (for up
to ``POLITENESS_THROTTLED_MAX_WAIT``, then it is a ``throttled`` dead letter), and requests to a
rated site leave this process spaced by Scrapy's downloader slot delay (``SPACING``/rate).

A site with no declared rate is started slowly (see :mod:`.slow_start`): its turns are booked on
the fleet's ramp until the site throttles, when the adaptive rate takes over, or until the ramp
ends and the site goes unpaced. A request that slept for a turn while the site's first throttle
answer came in does not use it: its turn was booked at the pace the site just refused.

A robots.txt ``Crawl-delay`` (read from the parser Scrapy's robots.txt middleware hands to the
``robots_parsed`` signal, so with ``ROBOTSTXT_OBEY`` on) is a ceiling like a declared rate: at
most one request per delay from the whole fleet, whatever else is declared. Every node reads the
site's robots.txt itself, so every node holds the same ceiling.
"""

from __future__ import annotations

import email.utils
import logging
import time
import uuid
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from scrapy import Request, signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Response
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred, DeferredList, DeferredLock
from twisted.internet.task import LoopingCall, deferLater

from ..backends.redis_client import get_redis
from ..runtime.secrets import redact
from . import slow_start
from .adaptive import HOLD
from .limiter import Limiter, Reservation
from .limits import DomainLimit, Policy, read_policy

logger = logging.getLogger(__name__)

#: meta key of the concurrency slot a request holds (private: it must not outlive the download).
TOKEN = "_politeness_token"
#: meta keys of a throttled request tried again: since when (epoch s), how many times.
THROTTLED_SINCE = "politeness_throttled_since"
THROTTLED_TIMES = "politeness_throttled"
THROTTLE_STATUSES = (429, 503)
# Requests to a rated site leave this process at least this share of 1/rate apart.
SPACING = 0.8
# After a site's first cut, past its hold: time for the nodes' last reports to land.
FIRST_HOLD_MARGIN = 0.3

HOLDER_TTL = 30.0  # a silent holder's slot frees itself after this; renewed every third of it
WAITER_TTL = 5.0  # a waiter that stops asking loses its place in the queue after this
POLL_MIN, POLL_NEXT, POLL_MAX = 0.05, 0.1, 0.5
ERROR_BACKOFF_MIN, ERROR_BACKOFF_MAX = 0.5, 5.0
WARNING_INTERVAL = 10.0


@dataclass
class _Holding:
    domain: str
    finalizer: weakref.finalize


class PolitenessMiddleware:
    def __init__(self, crawler: Any, policy: Policy, limiter: Limiter) -> None:
        self.crawler = crawler
        self.policy = policy
        self.limiter = limiter
        self.stats = crawler.stats
        self._held: dict[str, _Holding] = {}
        self._turns: dict[str, DeferredLock] = {}  # one poller per domain; the rest queue here
        self._naps: dict[str, Any] = {}  # the poller's sleep, cut short by a slot freed here
        self._saturated: set[str] = set()
        self._last_warning = float("-inf")
        self._wait_total = 0.0
        self._renewal: LoopingCall | None = None
        # Adaptive rates (see .adaptive): the fleet's, read every second; this process's
        # successful answers from those sites since; when it had its last answers from every
        # site, which a first cut reads.
        self._rates: dict[str, float] = {}
        self._answers: dict[str, int] = {}
        self._ceilings: dict[str, float] = {}
        self._pace: dict[str, deque[float]] = {}
        self._adapting: LoopingCall | None = None
        self._throttled_reported = 0
        self._node = uuid.uuid4().hex[:12]
        self._first_holds: dict[str, float] = {}  # domain -> until when (monotonic) it waits its first cut
        self._robots: dict[str, float] = {}  # domain -> 1/Crawl-delay of its robots.txt
        # Slow starts (see .slow_start): domain -> when the fleet's ramp began and when this node
        # last asked Redis about it (time.monotonic()).
        self._ramps: dict[str, tuple[float, float]] = {}
        conf = policy.adaptive
        self._ramp_seconds = slow_start.duration(conf.slow_start_rate, conf.slow_start_growth)
        self._slow_start = conf.enabled and self._ramp_seconds > 0

    @classmethod
    def from_crawler(cls, crawler: Any) -> PolitenessMiddleware:
        policy = read_policy(crawler.settings, getattr(crawler, "spider", None))
        obey_robots = crawler.settings.getbool("ROBOTSTXT_OBEY")
        if not policy.limits_anything and not policy.adaptive.enabled and not obey_robots:
            raise NotConfigured  # nothing to limit, and no warning about it
        limiter = Limiter(get_redis(crawler.settings["REDIS_URL"]), HOLDER_TTL, WAITER_TTL)
        mw = cls(crawler, policy, limiter)
        if obey_robots:
            crawler.signals.connect(mw.robots_parsed, signal=signals.robots_parsed)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    # -- signals -----------------------------------------------------------------------------

    def spider_opened(self, spider: Any) -> None:
        logger.info("Politeness limits, shared by every process on this Redis: %s", self.policy.describe())
        if self.policy.adaptive.enabled:
            logger.info(
                "Adaptive rates on: a site that answers 429 or 503 is slowed down for the whole fleet, "
                "then sped up again slowly (POLITENESS_ADAPTIVE)"
            )
            # Read at once: a node joining a fleet must know the rates of the sites that throttled
            # it before its first requests, not send them at full speed for a second.
            self._adapting = LoopingCall(lambda: deferred_from_coro(self._adapt()))
            self._adapting.start(1.0, now=True)
        if self._slow_start:
            conf = self.policy.adaptive
            logger.info(
                "Slow start: a site with no declared rate is sent %g requests/s by the whole fleet at first, "
                "x%g every second until it throttles or takes %g (POLITENESS_SLOW_START_RATE, _GROWTH)",
                conf.slow_start_rate,
                conf.slow_start_growth,
                slow_start.TOP,
            )
        self._renewal = LoopingCall(lambda: deferred_from_coro(self._renew()))
        self._renewal.start(HOLDER_TTL / 3, now=False)

    async def spider_closed(self, spider: Any) -> None:
        for loop in (self._renewal, self._adapting):
            if loop is not None and loop.running:
                loop.stop()
        releases = [self._release_token(token) for token in list(self._held)]
        await maybe_deferred_to_future(DeferredList([d for d in releases if d is not None]))

    def robots_parsed(self, robotparser: Any, request: Request) -> None:
        """A robots.txt ``Crawl-delay`` for our user agent caps its site's rate at 1/delay."""
        settings = self.crawler.settings
        agent = (
            settings.get("ROBOTSTXT_USER_AGENT")
            or request.headers.get(b"User-Agent")
            or settings.get("USER_AGENT")
            or "*"
        )
        try:
            delay = robotparser.crawl_delay(agent)  # Protego's parser (Scrapy's default) has it
        except Exception:
            return  # a parser without Crawl-delay, or a robots.txt it cannot read
        if not delay or delay <= 0:
            return
        limit = self.policy.for_host(urlparse_cached(request).hostname or "")
        ceiling = 1.0 / float(delay)
        if limit.domain in self._robots and self._robots[limit.domain] <= ceiling:
            return
        self._robots[limit.domain] = ceiling
        self.stats.set_value(f"politeness/crawl_delay/{limit.domain}", float(delay))
        logger.info(
            "robots.txt of %s asks Crawl-delay: %g s: the fleet sends it at most %.3g requests/s%s",
            limit.domain,
            delay,
            ceiling,
            f" (under the declared {limit.rate:g})" if limit.rate and limit.rate > ceiling else "",
        )
        if delay > 10:
            logger.warning(
                "%s asks a Crawl-delay of %g s: its pages come %d per minute at most, from the whole fleet",
                limit.domain,
                delay,
                max(1, int(60 / delay)),
            )

    # -- the hooks ---------------------------------------------------------------------------

    async def process_request(self, request: Request) -> None:
        self._release(request)  # a copy still holding a slot: a later middleware re-issued it
        url = urlparse_cached(request)
        if url.scheme not in ("http", "https"):
            return None
        limit = self.policy.for_host(url.hostname or "")
        if THROTTLED_SINCE in request.meta:
            self._give_up_if_late(request, limit.domain)
        await self._sit_out_first_hold(limit.domain)
        rate = self._rate(limit)
        ramp = not rate and self._ramping(limit)
        if not rate and not ramp and not limit.concurrency:
            return None
        started = time.monotonic()
        waited = False
        if limit.concurrency:
            token, waited = await self._take_slot(limit)
            self._hold(request, token, limit.domain)
        try:
            while rate or ramp:
                waited = await self._take_turn(limit, rate) or waited
                if not self._first_held(limit.domain):
                    break
                # The site's first throttle answer came while this request slept for its turn:
                # the turn was booked at the pace the site refused, and going out now it would
                # only be refused too.
                waited = True
                self.stats.inc_value("politeness/turns_given_up")
                await self._sit_out_first_hold(limit.domain)
                rate = self._rate(limit)
                ramp = not rate and self._ramping(limit)
        except BaseException:
            self._release(request)
            raise
        if waited:
            self.stats.inc_value("politeness/waited")
            self._wait_total += time.monotonic() - started
            self.stats.set_value("politeness/wait_seconds", round(self._wait_total, 3))
        return None

    def process_response(self, request: Request, response: Response) -> Response | Request:
        self._release(request)
        url = urlparse_cached(request)
        if url.scheme not in ("http", "https"):
            return response
        limit = self.policy.for_host(url.hostname or "")
        domain = limit.domain
        adaptive = self.policy.adaptive.enabled
        if response.status in THROTTLE_STATUSES:
            self._honour_retry_after(limit, response)
            if adaptive:
                return self._throttled(request, response, limit)
        elif response.status == 403 and adaptive and self._challenged(response):
            return self._challenge(request, response, limit)
        elif adaptive:
            self._count(domain)
            if domain in self._rates:
                self._answers[domain] = self._answers.get(domain, 0) + 1
                self._ceilings[domain] = self._ceiling(limit)
        rate = self._rate(limit)
        if rate:
            self._space(request, rate)
        return response

    def _challenged(self, response: Response) -> bool:
        """A 403 carrying a bot wall's challenge (``POLITENESS_BLOCK_PATTERN``): the site's way of
        saying "too fast", as a 429 is. Only 403s are read: a 200 is never searched."""
        pattern = self.policy.adaptive.block_pattern
        return pattern is not None and pattern.search(response.body[:65536]) is not None

    def _honour_retry_after(self, limit: DomainLimit, response: Response) -> None:
        """A site's Retry-After pauses its domain for every node, not just the one that was told."""
        seconds = retry_after_seconds(response.headers.get(b"Retry-After"))
        if seconds is None:
            return
        if not limit.active and not self.policy.adaptive.enabled:
            return
        self.stats.inc_value("politeness/retry_after")
        self._forget(self.limiter.pause(limit.domain, seconds), limit.domain)

    # -- slow start (see .slow_start) ---------------------------------------------------------

    def _ramping(self, limit: DomainLimit) -> bool:
        """Whether requests to *limit*'s site (one with no rate of its own) take turns on the
        fleet's slow start: while the ramp runs, or when this node must ask Redis where it stands."""
        if not self._slow_start or limit.unlimited:
            return False
        ramp = self._ramps.get(limit.domain)
        if ramp is None:
            return True
        began, asked = ramp
        now = time.monotonic()
        return now < began + self._ramp_seconds or now - asked >= slow_start.RECHECK

    async def _reserve_ramp(self, domain: str) -> Reservation:
        conf = self.policy.adaptive
        reservation, age = await self.limiter.reserve_ramp(
            domain, conf.slow_start_rate, conf.slow_start_growth, self.policy.max_wait
        )
        now = time.monotonic()
        if domain not in self._ramps:
            if len(self._ramps) >= 10_000:  # a broad crawl meets sites without end
                self._ramps.clear()
            if age < self._ramp_seconds:
                self.stats.inc_value("politeness/slow_starts")
                logger.debug("%s: slow start, %.1f s into the fleet's ramp", domain, age)
        self._ramps[domain] = (now - age, now)
        return reservation

    def _ramp_rate(self, domain: str) -> float:
        began, _ = self._ramps.get(domain, (time.monotonic(), 0.0))
        conf = self.policy.adaptive
        return slow_start.rate_at(conf.slow_start_rate, conf.slow_start_growth, time.monotonic() - began)

    async def _sit_out_first_hold(self, domain: str) -> None:
        """Wait while *domain* waits for its first cut (see :meth:`_hold_first`)."""
        if not self._first_holds:
            return
        until = self._first_holds.get(domain)
        if until is None:
            return
        if until > time.monotonic():
            await _sleep(until - time.monotonic())
        else:
            del self._first_holds[domain]

    def _first_held(self, domain: str) -> bool:
        until = self._first_holds.get(domain) if self._first_holds else None
        return until is not None and until > time.monotonic()

    # -- adaptive rate (see .adaptive) -------------------------------------------------------

    def _ceiling(self, limit: DomainLimit) -> float:
        """The most *limit*'s domain may get: the declared rate, or its robots.txt's 1/Crawl-delay
        if lower; 0 for none."""
        robots = self._robots.get(limit.domain) if self._robots else None
        if robots is None:
            return limit.rate
        return min(robots, limit.rate) if limit.rate else robots

    def _rate(self, limit: DomainLimit) -> float:
        """The rate requests to *limit*'s domain go at: the ceiling, or the fleet's adaptive
        one under it; 0 for none."""
        ceiling = self._ceiling(limit)
        adapted = self._rates.get(limit.domain)
        if adapted is None:
            return ceiling
        return min(adapted, ceiling) if ceiling else adapted

    def _count(self, domain: str) -> None:
        """Note a successful answer: what the site accepted in the last second is where a first
        cut starts (counting the 429s too would start it from what the site refused)."""
        pace = self._pace.get(domain)
        if pace is None:
            if len(self._pace) >= 10_000:  # a broad crawl meets sites without end
                self._pace.clear()
            pace = self._pace[domain] = deque(maxlen=4096)
        pace.append(time.monotonic())

    def _accepted(self, domain: str) -> float:
        return float(max(1, self._answered(domain)))

    def _answered(self, domain: str) -> int:
        """Successful answers from *domain* to this process in the last second."""
        pace = self._pace.get(domain)
        if not pace:
            return 0
        since = time.monotonic() - 1.0
        return sum(1 for t in reversed(pace) if t >= since)

    def _slow_down(self, limit: DomainLimit) -> None:
        """Cut the site's rate for every node (see :mod:`.adaptive`)."""
        domain = limit.domain
        observed = self._accepted(domain)
        if domain not in self._rates:
            self._hold_first(domain, HOLD)
        self._forget(self._cut(domain, observed, self._ceiling(limit)), domain)

    def _challenge(self, request: Request, response: Response, limit: DomainLimit) -> Response:
        """A bot wall's challenge: the site says "too fast" as a 429 does, so the fleet slows down,
        but a wall may never let this client through, so the page is not tried again here (that
        could hold the crawl for ``POLITENESS_THROTTLED_MAX_WAIT`` a page): it is a ``blocked``
        dead letter, for ``scrapy dlq requeue SPIDER --reason blocked`` once the wall lets up (or
        for the scraping API's escalation, which sees the answer first when a route asks for it)."""
        self._slow_down(limit)
        self.stats.inc_value("politeness/challenge_answers")
        if request.callback is NO_CALLBACK or request.meta.get("handle_httpstatus_all"):
            return response
        if response.status in (request.meta.get("handle_httpstatus_list") or ()):
            return response
        from ..middlewares.dead_letters import bury

        bury(self.crawler, request, "blocked", int(request.meta.get(THROTTLED_TIMES, 0)) + 1)
        raise IgnoreRequest(f"{limit.domain} answered a bot wall's challenge: set aside as a blocked dead letter")

    def _throttled(self, request: Request, response: Response, limit: DomainLimit) -> Response | Request:
        """The site throttled the fleet: slow its domain down for every node, and try the request
        again at the slower rate, without spending its retry budget, for up to
        ``POLITENESS_THROTTLED_MAX_WAIT``; past that it is a dead letter (``throttled``)."""
        domain = limit.domain
        self._slow_down(limit)
        self.stats.inc_value("politeness/throttle_answers")
        handled = request.meta.get("handle_httpstatus_list") or ()
        if (
            request.meta.get("dont_retry")
            or request.meta.get("handle_httpstatus_all")
            or response.status in handled
            or request.callback is NO_CALLBACK
        ):
            return response
        since = float(request.meta.get(THROTTLED_SINCE) or time.time())
        self._give_up_if_late(request, domain)
        retry = request.replace(dont_filter=True)
        retry.meta[THROTTLED_SINCE] = since
        retry.meta[THROTTLED_TIMES] = int(request.meta.get(THROTTLED_TIMES, 0)) + 1
        self.stats.inc_value("politeness/throttled_retries")
        if THROTTLED_TIMES not in request.meta:
            self.stats.inc_value("politeness/throttled_pages")
        return retry

    def _hold_first(self, domain: str, seconds: float) -> None:
        """A site's first cut: send it nothing until every node has said what it saw (see
        :mod:`.adaptive`), then read the fleet's rate."""
        from twisted.internet import reactor

        if domain in self._first_holds:
            return
        self._first_holds[domain] = time.monotonic() + seconds + FIRST_HOLD_MARGIN
        reactor.callLater(seconds + FIRST_HOLD_MARGIN / 2, lambda: deferred_from_coro(self._adapt()))

    def _give_up_if_late(self, request: Request, domain: str) -> None:
        """A request throttled for longer than ``POLITENESS_THROTTLED_MAX_WAIT`` (since its first
        429, by this host's clock) becomes a dead letter (``throttled``), before it waits again."""
        limit = self.policy.adaptive.throttled_max_wait
        since = request.meta.get(THROTTLED_SINCE)
        if since is None or time.time() - float(since) <= limit:
            return
        from ..middlewares.dead_letters import bury

        bury(self.crawler, request, "throttled", int(request.meta.get(THROTTLED_TIMES, 0)) + 1)
        raise IgnoreRequest(
            f"throttled by {domain} for over {limit:g} s (POLITENESS_THROTTLED_MAX_WAIT): set aside as a dead letter"
        )

    async def _cut(self, domain: str, observed: float, ceiling: float, join: bool = False) -> None:
        conf = self.policy.adaptive
        rate = await self.limiter.cut(domain, observed, conf.decrease, conf.min_rate, ceiling, self._node, join)
        if domain in self._rates and not join:  # a later cut (a first one is read when its hold ends)
            self._rates[domain] = rate
            self._note_rate(domain, rate)

    def _join_first_cut(self, domain: str) -> None:
        answered = self._answered(domain)
        if answered:
            ceiling = self._ceiling(self.policy.for_host(domain))
            self._forget(self._cut(domain, float(answered), ceiling, join=True), domain)

    async def _adapt(self) -> None:
        answers = [(d, n, self._ceilings.get(d, 0.0)) for d, n in self._answers.items()]
        self._answers = {}
        try:
            found = await self.limiter.adapt(answers, self.policy.adaptive.increase)
        except Exception as exc:
            self._on_redis_error(exc, 1, ", ".join(sorted(d for d, _, _ in answers)) or "adaptive rates")
            return
        rates = {}
        for domain, (rate, since_cut) in found.items():
            if domain not in self._rates and since_cut < HOLD and not self._first_held(domain):
                # Learnt from another node mid-way: this node saw no throttle answer itself, but
                # what it was sending is part of what the site refused.
                self._hold_first(domain, HOLD - since_cut)
                self._join_first_cut(domain)
            rates[domain] = rate
            if since_cut >= HOLD:  # a first cut adds the nodes' reports until then
                self._note_rate(domain, rate)
        self._rates = rates

    def _note_rate(self, domain: str, rate: float) -> None:
        """The rate in the stats (the run report, the metrics), for a bounded number of sites."""
        key = f"politeness/rate/{domain}"
        stats = self.stats
        if stats.get_value(key) is None and self._throttled_reported >= 100:
            return
        if stats.get_value(key) is None:
            self._throttled_reported += 1
            logger.info(
                "%s throttles the fleet (429/503): its rate is now %.2f requests/s, shared by every "
                "node, and adapts from there",
                domain,
                rate,
            )
        stats.set_value(key, round(rate, 3))
        stats.min_value(f"politeness/rate_min/{domain}", round(rate, 3))

    def _space(self, request: Request, rate: float) -> None:
        """Space this process's requests to a rated site where they leave, in the downloader: the
        turns are 1/rate apart, but requests queued in Scrapy's slot would otherwise go out
        together when it frees up."""
        downloader = getattr(self.crawler.engine, "downloader", None)
        if downloader is None:
            return
        slot = downloader.slots.get(downloader.get_slot_key(request))
        if slot is not None:
            delay = SPACING / rate
            if slot.delay != delay:
                slot.delay, slot.jitter = delay, 0.0

    async def take_turn(self, url: str) -> None:
        """A turn under the rate of *url*'s site, without a concurrency slot: for what a page
        being downloaded asks of its own site (a rendered page's scripts and data), while the page
        itself holds the slot."""
        limit = self.policy.for_host(urlsplit(url).hostname or "")
        await self._sit_out_first_hold(limit.domain)
        rate = self._rate(limit)
        if rate or self._ramping(limit):
            started = time.monotonic()
            if await self._take_turn(limit, rate):
                self.stats.inc_value("politeness/waited")
                self._wait_total += time.monotonic() - started
                self.stats.set_value("politeness/wait_seconds", round(self._wait_total, 3))

    def process_exception(self, request: Request, exception: Exception) -> None:
        self._release(request)
        return None

    # -- rate --------------------------------------------------------------------------------

    async def _take_turn(self, limit: DomainLimit, rate: float) -> bool:
        """Reserve the domain's next turn (at *rate*; 0: on its slow start) and sleep until it
        comes; True if that meant waiting."""
        waited, errors = False, 0
        while True:
            try:
                if rate:
                    reservation = await self.limiter.reserve(limit.domain, rate, self.policy.max_wait)
                else:
                    reservation = await self._reserve_ramp(limit.domain)
            except Exception as exc:
                errors += 1
                await _sleep(self._on_redis_error(exc, errors, limit.domain))
                continue
            if reservation.reserved:
                if reservation.wait > 0:
                    await _sleep(reservation.wait)
                return waited or reservation.wait > 0
            # Turns are booked up to POLITENESS_MAX_WAIT ahead: come back when there is room.
            waited = True
            self._note_saturated(limit, rate or self._ramp_rate(limit.domain), reservation.wait)
            await _sleep(max(reservation.wait - self.policy.max_wait, self.policy.max_wait / 4))

    def _note_saturated(self, limit: DomainLimit, rate: float, wait: float) -> None:
        if limit.domain in self._saturated:
            return
        self._saturated.add(limit.domain)
        self.stats.inc_value("politeness/saturated_domains")
        logger.info(
            "The fleet asks %s for more than its rate of %g requests/s: its next free turn is %.0f s "
            "ahead, past POLITENESS_MAX_WAIT (%g s). Requests to it wait for their turn (logged once).",
            limit.domain,
            rate,
            wait,
            self.policy.max_wait,
        )

    # -- concurrency -------------------------------------------------------------------------

    async def _take_slot(self, limit: DomainLimit) -> tuple[str, bool]:
        turn = self._turns.setdefault(limit.domain, DeferredLock())
        await maybe_deferred_to_future(turn.acquire())
        try:
            return await self._poll_slot(limit)
        finally:
            turn.release()
            if not turn.locked:  # nobody else waiting here
                self._turns.pop(limit.domain, None)

    async def _poll_slot(self, limit: DomainLimit) -> tuple[str, bool]:
        token = uuid.uuid4().hex
        delay, errors, waited = POLL_MIN, 0, False
        try:
            while True:
                try:
                    admission = await self.limiter.acquire(limit.domain, token, limit.concurrency)
                except Exception as exc:
                    errors += 1
                    await _sleep(self._on_redis_error(exc, errors, limit.domain))
                    continue
                if admission.admitted:
                    return token, waited
                if not waited:
                    waited = True
                    self.stats.inc_value("politeness/concurrency_waits")
                cap = POLL_NEXT if admission.ahead < limit.concurrency else POLL_MAX
                await self._nap(limit.domain, min(delay, cap))
                delay = min(delay * 2, POLL_MAX)
        except BaseException:
            # Cancelled: give up the place in the queue, and the slot if it was granted unseen.
            self._forget(self.limiter.leave(limit.domain, token), limit.domain)
            self._forget(self.limiter.release(limit.domain, token), limit.domain)
            raise

    async def _nap(self, domain: str, seconds: float) -> None:
        from twisted.internet import reactor

        woken: Deferred[None] = Deferred()
        call = reactor.callLater(seconds, woken.callback, None)
        self._naps[domain] = call
        try:
            await maybe_deferred_to_future(woken)
        finally:
            if call.active():
                call.cancel()
            if self._naps.get(domain) is call:
                del self._naps[domain]

    def _hold(self, request: Request, token: str, domain: str) -> None:
        finalizer = weakref.finalize(request, self._release_lost, token)
        finalizer.atexit = False
        self._held[token] = _Holding(domain, finalizer)
        request.meta[TOKEN] = token

    def _release(self, request: Request) -> None:
        token = request.meta.pop(TOKEN, None)
        if token is not None:
            self._release_token(token)

    def _release_token(self, token: str) -> Deferred | None:
        holding = self._held.pop(token, None)
        if holding is None:
            return None  # given back already
        holding.finalizer.detach()
        nap = self._naps.get(holding.domain)
        if nap is not None and nap.active():
            nap.reset(0)  # this process's next waiter may have the slot now
        return self._forget(self.limiter.release(holding.domain, token), holding.domain)

    def _release_lost(self, token: str) -> None:
        """The request was garbage collected holding a slot: no hook gave it back."""
        from twisted.internet import reactor

        def release() -> None:
            if token in self._held:
                self.stats.inc_value("politeness/released_by_gc")
                self._release_token(token)

        # Garbage collection may run anywhere, even on another thread: act on the reactor's.
        reactor.callFromThread(release)

    async def _renew(self) -> None:
        by_domain: dict[str, list[str]] = {}
        for token, holding in list(self._held.items()):
            by_domain.setdefault(holding.domain, []).append(token)
        for domain, tokens in by_domain.items():
            try:
                held = await self.limiter.renew(domain, tokens)
            except Exception as exc:
                self._on_redis_error(exc, 1, domain)
                continue
            still_mine = sum(1 for t in tokens if t in self._held)
            if held < still_mine:
                # Only if renewals stalled for HOLDER_TTL: the fleet may exceed the limit briefly.
                self.stats.inc_value("politeness/slots_expired", still_mine - held)
                logger.warning(
                    "%d concurrency slot(s) of %s expired before they were renewed", still_mine - held, domain
                )

    # -- helpers -----------------------------------------------------------------------------

    def _on_redis_error(self, exc: Exception, errors: int, domain: str) -> float:
        self.stats.inc_value("politeness/redis_errors")
        now = time.monotonic()
        if now - self._last_warning >= WARNING_INTERVAL:
            self._last_warning = now
            logger.warning(
                "Politeness limiter: Redis failed (%s: %s); requests to %s wait and ask again",
                type(exc).__name__,
                redact(str(exc))[:300],
                domain,
            )
        return min(ERROR_BACKOFF_MIN * 2 ** (errors - 1), ERROR_BACKOFF_MAX)

    def _forget(self, coro: Any, domain: str) -> Deferred:
        """Run *coro* without waiting for it. On failure a slot stays taken until its deadline."""

        def failed(failure: Any) -> None:
            self._on_redis_error(failure.value, 1, domain)

        return deferred_from_coro(coro).addErrback(failed)


# A longer Retry-After is not waited out by the fleet: the request's own retry budget handles it.
RETRY_AFTER_MAX = 300.0


def retry_after_seconds(value: bytes | None) -> float | None:
    """Retry-After as seconds from now (delay-seconds or an HTTP date), capped; None if unreadable."""
    if not value:
        return None
    text = value.decode("latin-1").strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - time.time()
    if seconds != seconds or seconds <= 0:
        return None
    return min(seconds, RETRY_AFTER_MAX)


async def _sleep(seconds: float) -> None:
    from twisted.internet import reactor

    if seconds > 0:
        await maybe_deferred_to_future(deferLater(reactor, seconds, lambda: None))
