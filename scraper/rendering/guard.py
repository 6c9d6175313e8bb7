"""The fetch boundary for everything a rendered page asks for.

A page's scripts choose what the browser fetches, so every request it makes is routed through
here before anything leaves (Playwright's context routing: documents, frames, scripts, styles,
XHR, fetch, beacons, event streams), and the browser itself never opens a connection:

* the page's own document is the body the downloader already fetched (through the boundary
  middleware, the politeness limits and the rest), handed to the browser as it is;
* a type in ``RENDER_BLOCK_RESOURCES`` (images, fonts, media by default) is refused unfetched;
* anything else must be http(s) to a public address; a host that is, or resolves to, a
  loopback, private, link-local or metadata address is refused, unless ``FETCH_ALLOW_NETWORKS``
  allows its network *and* it is the page's own origin: an allowed network is where the spider's
  site is, not a door for the site's scripts to the node's other neighbours;
* it is fetched by Playwright with redirects off, and each hop is checked again before it is
  followed (Chromium follows the redirects of a routed request on its own, unchecked);
* WebSockets are refused (not http(s)); service workers are blocked, popups closed, and WebRTC
  may not open a connection of its own (see :mod:`.browser`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import weakref
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

from ..middlewares.fetch_boundary import FetchBoundaryMiddleware, forbidden

logger = logging.getLogger(__name__)

REDIRECTS = (301, 302, 303, 307, 308)
_RESOLVED_TTL = 300.0
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Headers of the downloader's answer that describe its transfer, not the page.
_TRANSFER_HEADERS = frozenset({"content-length", "content-encoding", "transfer-encoding", "connection"})


def origin_of(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme, 0)


@dataclass
class Document:
    """The page as the downloader fetched it, for the browser's navigation to it."""

    url: str
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class PageState:
    document: Document
    origin: tuple[str, str, int]
    in_flight: int = 0
    last_activity: float = field(default_factory=time.monotonic)
    refused: list[str] = field(default_factory=list)

    def busy(self) -> None:
        self.in_flight += 1
        self.last_activity = time.monotonic()

    def done(self) -> None:
        self.in_flight -= 1
        self.last_activity = time.monotonic()

    async def quiet(self, seconds: float) -> None:
        """Until no request of the page has been in flight for *seconds*."""
        while True:
            idle = time.monotonic() - self.last_activity
            if self.in_flight == 0 and idle >= seconds:
                return
            await asyncio.sleep(max(0.01, seconds - idle if self.in_flight == 0 else 0.02))


class Guard:
    def __init__(self, crawler: Any, block: frozenset[str], max_redirects: int, timeout: float) -> None:
        # The very networks the boundary middleware allows (FETCH_ALLOW_NETWORKS, or loopback for
        # the embedded default and developer commands), decided by the same code.
        self.allowed = FetchBoundaryMiddleware(crawler).allowed
        self.crawler = crawler
        self.stats = crawler.stats
        self._politeness: Any = None  # the crawl's politeness middleware, found at the first request
        self.block = block
        self.max_redirects = max_redirects
        self.timeout_ms = timeout * 1000
        self.pages: weakref.WeakKeyDictionary[Any, PageState] = weakref.WeakKeyDictionary()
        self._resolved: dict[str, tuple[list[str], float]] = {}

    # -- Playwright's handlers ------------------------------------------------------------------

    async def route(self, route: Any) -> None:
        request = route.request
        state = self._state(request)
        kind = request.resource_type
        try:
            if state is not None and self._is_document(request, state):
                await self._fulfill_document(route, state.document)
                return
            if kind in self.block:
                self.stats.inc_value(f"render/blocked/{kind}")
                await route.abort("blockedbyclient")
                return
            if state is not None:
                state.busy()
            try:
                await self._fetch(route, request, state)
            finally:
                if state is not None:
                    state.done()
        except Exception as exc:  # the page or the browser went away meanwhile
            logger.debug("Route of %s ended: %s", request.url[:200], exc)
            try:
                await route.abort("failed")
            except Exception:
                pass

    async def websocket(self, ws: Any) -> None:
        """Not http(s): refused, never connected."""
        self._refuse(self._state_of_page(None), ws.url, "forbidden_scheme", "WebSockets are not fetched")
        try:
            await ws.close(code=1008, reason="not allowed")
        except Exception:
            pass

    # -- the checks -----------------------------------------------------------------------------

    async def verdict(self, url: str, state: PageState | None) -> tuple[str, str] | None:
        """(reason, why) if the browser may not fetch *url* for the page of *state*, else None."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            return "forbidden_scheme", f"scheme {scheme or '(none)'!r} is not fetched"
        host = (parts.hostname or "").lower()
        if not host:
            return "forbidden_address", "no host"
        addresses = await self._addresses(host)
        if not addresses:
            return None  # unresolvable: the fetch fails on its own
        if not any(forbidden(a, []) for a in addresses):
            return None  # public
        bad = [a for a in addresses if forbidden(a, self.allowed)]
        if bad:
            return "forbidden_address", f"{host} is a non-public address ({', '.join(bad)})"
        if state is None or origin_of(url) != state.origin:
            return (
                "forbidden_address",
                f"{host} is a non-public address and not the page's own site "
                "(FETCH_ALLOW_NETWORKS opens a network to the spider's site only)",
            )
        return None

    async def _addresses(self, host: str) -> list[str]:
        found = self._resolved.get(host)
        if found is not None and found[1] > time.monotonic():
            return found[0]
        try:
            import ipaddress

            addresses = [str(ipaddress.ip_address(host.strip("[]")))]
        except ValueError:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
                addresses = sorted({info[4][0] for info in infos})
            except OSError:
                addresses = []
        if len(self._resolved) >= 10_000:
            self._resolved.clear()
        self._resolved[host] = (addresses, time.monotonic() + _RESOLVED_TTL)
        return addresses

    # -- fetching ---------------------------------------------------------------------------------

    async def _fetch(self, route: Any, request: Any, state: PageState | None) -> None:
        url, method, body = request.url, request.method, request.post_data_buffer
        for _hop in range(self.max_redirects + 1):
            refusal = await self.verdict(url, state)
            if refusal is not None:
                self._refuse(state, url, *refusal)
                await route.abort("blockedbyclient")
                return
            self.stats.inc_value("render/requests")
            if state is not None and origin_of(url)[1] == state.origin[1]:
                await self._polite(url)  # the page's own site: its rate counts what the page asks too
            response = await route.fetch(
                url=url, method=method, post_data=body, max_redirects=0, timeout=self.timeout_ms
            )
            location = response.headers.get("location")
            if response.status not in REDIRECTS or not location:
                await route.fulfill(response=response)
                return
            await response.dispose()
            self.stats.inc_value("render/redirects")
            url = urljoin(url, location)
            if response.status == 303 or (response.status in (301, 302) and method == "POST"):
                method, body = "GET", None
        self._refuse(state, url, "redirects", f"more than {self.max_redirects} redirects")
        await route.abort("failed")

    async def _polite(self, url: str) -> None:
        if self._politeness is None:
            self._politeness = _find_politeness(self.crawler)
        if self._politeness is not False:
            self.stats.inc_value("render/polite_requests")
            await self._politeness.take_turn(url)

    async def _fulfill_document(self, route: Any, document: Document) -> None:
        await route.fulfill(status=document.status, headers=document.headers, body=document.body)

    # -- helpers ----------------------------------------------------------------------------------

    def _refuse(self, state: PageState | None, url: str, reason: str, why: str) -> None:
        self.stats.inc_value(f"render/refused/{reason}")
        if state is not None:
            state.refused.append(url)
        logger.warning(
            "Not fetched for %s: %s (%s)",
            state.document.url[:200] if state is not None else "a rendered page",
            url[:300],
            why,
        )

    @staticmethod
    def _is_document(request: Any, state: PageState) -> bool:
        if not request.is_navigation_request() or request.url != state.document.url:
            return False
        frame = request.frame
        return frame.parent_frame is None

    def _state(self, request: Any) -> PageState | None:
        try:
            page = request.frame.page
        except Exception:  # a worker's request: no frame, no page of ours
            return None
        return self._state_of_page(page)

    def _state_of_page(self, page: Any) -> PageState | None:
        return self.pages.get(page) if page is not None else None


def document_headers(headers: Any) -> dict[str, str]:
    """The downloader's answer's headers as the browser gets them: the body is already decoded."""
    out: dict[str, str] = {}
    for name, values in headers.items():
        key = name.decode("latin-1")
        if key.lower() in _TRANSFER_HEADERS:
            continue
        out[key] = "\n".join(v.decode("latin-1") for v in values)
    return out


def _find_politeness(crawler: Any) -> Any:
    """The crawl's PolitenessMiddleware, or False when it is not loaded (nothing to limit)."""
    from ..politeness.middleware import PolitenessMiddleware

    try:
        middlewares = crawler.engine.downloader.middleware.middlewares
    except Exception:
        return False
    return next((m for m in middlewares if isinstance(m, PolitenessMiddleware)), False)
