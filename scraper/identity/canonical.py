"""A page's canonical link: the item's URL, and an alias the fleet remembers.

For each HTML page, a same-host ``<link rel="canonical">`` names the page the response is: the
page's URL (after the spider's URL policy) becomes an alias of it (:mod:`.aliases`), shared with
the fleet in Redis, so the next run fetches the page once whatever path leads to it. Every URL
field of the page's items loses its trackers and session id (:mod:`.policy`), and an item whose
``url`` is the page's own takes the page's identity: its canonical URL, else the URL a known
alias names. A page with no canonical link holds its first item back until its output ends: a
sole item whose url is the page's own speaks for the page (:mod:`.content`). So a stored URL
changes only when the page's identity does, never because the links were found in another order.

The link is found with a byte search over the head of the body (no parse: ~2 µs a page). A
canonical link to another host is not followed (a CDN or a syndication partner is not the page).
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import AsyncIterator, Iterable
from typing import Any
from urllib.parse import urljoin, urlsplit

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.http import TextResponse
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import threads
from twisted.internet.defer import succeed
from twisted.internet.task import LoopingCall

from ..backends.redis_client import UNREACHABLE, get_redis
from ..items.base import StoredItem
from ..queue.keys import aliases_key
from ..runs_hook import current_run_id
from ..shared_state import is_crawl_node
from .content import SoleItem
from .fingerprint import IdentityFingerprinter

logger = logging.getLogger(__name__)

_HEAD = 65536
FLUSH_EVERY = 2.0  # seconds between two writes of the aliases learnt
_LINK = re.compile(rb"<link\b[^>]*?\brel\s*=\s*[\"']?canonical\b[^>]*>", re.IGNORECASE)
_HREF = re.compile(rb"\bhref\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^\s\"'>]+))", re.IGNORECASE)


# The last page's answer: this middleware and the page-state recorder both ask for each page's
# link (~80k instructions a page, mostly URL parsing); a response's URL and body never change.
_last: tuple[weakref.ref[Any], str | None] | None = None


def canonical_link(response: Any) -> str | None:
    """The absolute URL of *response*'s same-host canonical link, or None."""
    global _last
    if not isinstance(response, TextResponse):
        return None
    last = _last
    if last is not None and last[0]() is response:
        return last[1]
    found = _canonical_link(response)
    _last = (weakref.ref(response), found)
    return found


def _canonical_link(response: TextResponse) -> str | None:
    head = response.body[:_HEAD]
    if b"canonical" not in head and b"CANONICAL" not in head:
        return None
    tag = _LINK.search(head)
    if tag is None:
        return None
    href = _HREF.search(tag.group(0))
    if href is None:
        return None
    raw = next(g for g in href.groups() if g is not None).strip()
    if not raw:
        return None
    url = urljoin(response.url, raw.decode(response.encoding or "utf-8", "replace").replace("&amp;", "&"))
    try:
        own, found = urlsplit(response.url), urlsplit(url)
    except ValueError:
        return None
    if found.scheme not in ("http", "https") or (found.hostname or "") != (own.hostname or ""):
        return None
    return url


class CanonicalMiddleware:
    def __init__(self, crawler: Any, fingerprinter: IdentityFingerprinter) -> None:
        self.crawler = crawler
        self.fingerprinter = fingerprinter
        self.stats = crawler.stats
        self.server: Any = None
        self.key = ""
        self._url_fields: dict[type, tuple[str, ...]] = {}
        # Learnt here, not yet in Redis: written in one command every FLUSH_EVERY seconds, in a
        # thread (one round trip per page on the reactor cost a fifth of a crawl's CPU).
        self._unsent: dict[str, str] = {}
        self._flushing: LoopingCall | None = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> CanonicalMiddleware:
        fingerprinter = crawler.request_fingerprinter
        if not isinstance(fingerprinter, IdentityFingerprinter):
            raise NotConfigured("REQUEST_FINGERPRINTER_CLASS is not the identity fingerprinter")
        mw = cls(crawler, fingerprinter)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    def spider_opened(self, spider: Any) -> None:
        if not is_crawl_node(self.crawler.settings) or not self.crawler.settings.get("REDIS_URL"):
            return  # a developer command: what it learns stays in memory
        self.server = get_redis(self.crawler.settings["REDIS_URL"])
        self.key = aliases_key(spider.name)
        try:
            loaded = self.fingerprinter.aliases.load(self.server, self.key, current_run_id(self.crawler))
        except UNREACHABLE as exc:
            logger.warning("Could not read the aliases learnt by earlier runs (%s): this run learns them again", exc)
            return
        if loaded:
            logger.info(
                "%d URL aliases learnt in earlier runs (canonical links, pages yielding the same item): "
                "each is fetched as its page",
                loaded,
            )
        self.stats.set_value("identity/aliases_known", loaded)
        self._flushing = LoopingCall(self._flush)
        self._flushing.start(FLUSH_EVERY, now=False)

    async def spider_closed(self, spider: Any) -> None:
        if self._flushing is not None and self._flushing.running:
            self._flushing.stop()
        await maybe_deferred_to_future(self._flush())

    def _flush(self) -> Any:
        if not self._unsent or self.server is None:
            return succeed(None)
        batch, self._unsent = self._unsent, {}

        def send() -> None:
            try:
                self.server.hset(self.key, mapping=batch)
            except UNREACHABLE:
                pass  # this node knows them; the next run learns them again

        return threads.deferToThread(send)

    def _learn(self, response: Any) -> str | None:
        """The page's canonical URL (or None), recorded as the identity of the page's URL."""
        canonical = canonical_link(response)
        if canonical is None:
            return None
        canonical = self.fingerprinter.policy.apply(canonical)
        own = self.fingerprinter.policy.apply(response.url)
        if own != canonical and self.fingerprinter.aliases.note(own, canonical):
            self.stats.inc_value("identity/aliases_learnt")
            if self.server is not None:
                run_id = current_run_id(self.crawler)
                self._unsent[own] = canonical if run_id is None else f"{run_id} {canonical}"
        return canonical

    def _fields(self, item: StoredItem) -> tuple[str, ...]:
        found = self._url_fields.get(type(item))
        if found is None:
            found = tuple(name for name, meta in item.fields.items() if meta.get("clean") == "url")
            self._url_fields[type(item)] = found
        return found

    def _own(self, response: Any, canonical: str | None) -> tuple[str, str, str]:
        """The URLs an item may give for the page's own (as fetched, after the policy), and the
        page's identity: its canonical URL, else the URL a known alias names. Once per page with
        items, not per item."""
        applied = self.fingerprinter.policy.apply(response.url)
        return (
            response.url,
            applied,
            canonical if canonical is not None else self.fingerprinter.aliases.resolve(applied),
        )

    def _fix(self, obj: StoredItem, own: tuple[str, str, str]) -> bool:
        """Clean *obj*'s URL fields; True when its url is the page's own (it then takes the page's identity)."""
        policy = self.fingerprinter.policy
        found = False
        for name in self._fields(obj):
            value = obj.get(name)
            if not isinstance(value, str):
                continue
            if name == "url" and (value == own[0] or value == own[1]):
                obj[name], found = own[2], True
            else:
                obj[name] = policy.apply(value)
        return found

    def process_spider_output(self, response: Any, result: Iterable[Any]) -> Iterable[Any]:
        stream = _PageStream(self, response)
        try:
            for obj in result:
                yield from stream.take(obj)
        except Exception:
            yield from stream.release()
            raise
        yield from stream.end()

    async def process_spider_output_async(self, response: Any, result: AsyncIterator[Any]) -> AsyncIterator[Any]:
        stream = _PageStream(self, response)
        try:
            async for obj in result:
                for out in stream.take(obj):
                    yield out
        except Exception:
            for out in stream.release():
                yield out
            raise
        for out in stream.end():
            yield out


class _PageStream:
    """One page's output through the middleware, the same for sync and async callbacks: items'
    URL fields fixed; on a page without a canonical link, its first item held until the page
    shows whether it is the page's sole item (see SoleItem)."""

    def __init__(self, middleware: Any, response: Any) -> None:
        self.middleware = middleware
        self.response = response
        self.canonical = middleware._learn(response)
        self.own: tuple[str, str, str] | None = None
        self.sole = SoleItem() if self.canonical is None else None

    def take(self, obj: Any) -> list[Any]:
        if not isinstance(obj, StoredItem):
            return [obj]
        self.own = self.own or self.middleware._own(self.response, self.canonical)
        own_url = self.middleware._fix(obj, self.own)
        if self.sole is None:
            return [obj]
        if self.sole.hold(obj, own_url):
            return []
        return [*self.release(), obj]

    def release(self) -> list[Any]:
        held = self.sole.release() if self.sole is not None else None
        return [] if held is None else [held]

    def end(self) -> list[Any]:
        if self.sole is None:
            return []
        held = self.sole.end(self.own[2] if self.own else "")
        return [] if held is None else [held]
