"""One Chromium per node, kept bounded: a ceiling on open pages, contexts replaced after a number
of pages, and a crashed browser started again.

Playwright is imported here, when the first page is rendered, never by a crawl that renders
nothing. The browser is Debian's Chromium (``RENDER_BROWSER``), started by Playwright: its own
browser downloads are not used.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any

from ..config import ConfigError
from .config import RenderConfig
from .guard import Guard

logger = logging.getLogger(__name__)

# Closing what a dead browser held may never answer: it is given this long, then left.
CLOSE_TIMEOUT = 5.0
LAUNCH_TIMEOUT = 30.0
OPEN_TIMEOUT = 10.0

ARGS = (
    # No traffic of the browser's own (updates, safe browsing, metrics, field trials).
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--metrics-recording-only",
    "--disable-features=Translate,OptimizationHints,MediaRouter,InterestFeedContentSuggestions",
    # WebRTC opens its own sockets, around any routing: UDP and TCP only through a proxy, and
    # there is none.
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--disable-quic",
    "--disable-dev-shm-usage",
)
# Scripts of the page see no WebRTC at all: its ICE servers are connections routing cannot see.
NO_WEBRTC = """
for (const name of ["RTCPeerConnection", "webkitRTCPeerConnection", "RTCDataChannel", "WebTransport"]) {
  try { delete window[name]; } catch (e) {}
  try { Object.defineProperty(window, name, {value: undefined, configurable: false}); } catch (e) {}
}
"""


class BrowserCrashed(Exception):
    """The browser (or the page's renderer) died under a page."""


@dataclass
class _Context:
    context: Any
    served: int = 0
    open: int = 0
    retiring: bool = False


class Browser:
    def __init__(self, conf: RenderConfig, guard: Guard, stats: Any) -> None:
        self.conf = conf
        self.guard = guard
        self.stats = stats
        self.slots = asyncio.Semaphore(conf.max_pages)
        self.generation = 0  # +1 per start: a page knows which browser it was opened in
        self._playwright: Any = None
        self._manager: Any = None
        self._browser: Any = None
        self._context: _Context | None = None
        self._starting = asyncio.Lock()
        self._switching = asyncio.Lock()
        self._closed = False
        self._sink: _Sink | None = None

    # -- the browser ------------------------------------------------------------------------------

    async def _ensure(self) -> Any:
        async with self._starting:
            if self._browser is not None and self._browser.is_connected():
                return self._browser
            if self._closed:
                raise BrowserCrashed("the renderer is closed")
            if self._browser is not None:
                await self._discard()
            if not os.access(self.conf.browser, os.X_OK):
                raise ConfigError(
                    f"RENDER_BROWSER: {self.conf.browser} is not an executable Chromium "
                    "(`make tools` installs Debian's chromium)"
                )
            if self._playwright is None:
                from playwright.async_api import async_playwright

                self._manager = async_playwright()
                self._playwright = await self._manager.start()
            if self._sink is None:
                self._sink = await _Sink.start(self.stats)
            # Every connection the browser opens itself goes to the sink, never to the network:
            # what the guard lets through is fetched by Playwright, not by Chromium, so only what
            # bypasses routing (a preconnect, a speculative connection) would ever use this proxy.
            args = [*ARGS, f"--proxy-server=http://127.0.0.1:{self._sink.port}", "--proxy-bypass-list=<-loopback>"]
            if os.geteuid() == 0:
                args.append("--no-sandbox")  # Chromium's sandbox refuses to run as root
            try:
                self._browser = await self._playwright.chromium.launch(
                    executable_path=self.conf.browser, args=args, headless=True, timeout=LAUNCH_TIMEOUT * 1000
                )
            except Exception as exc:
                # A browser killed while it starts (or one that cannot start now: no memory) is a
                # crash like any other: the page is rendered again, up to RENDER_CRASH_RETRIES.
                self.stats.inc_value("render/launch_failures")
                logger.warning("The browser did not start: %s", str(exc).splitlines()[0][:200])
                raise BrowserCrashed() from exc
            self.generation += 1
            self.stats.inc_value("render/browser_starts")
            if self.generation > 1:
                logger.warning("The browser was started again (start %d)", self.generation)
            return self._browser

    async def _discard(self) -> None:
        browser, self._browser, self._context = self._browser, None, None
        await _close_quietly(browser)

    async def crashed(self, generation: int, force: bool = False) -> None:
        """A page of browser *generation* saw it die (or, *force*, stop answering): the next
        page starts a new one."""
        async with self._starting:
            if generation == self.generation and self._browser is not None:
                if force and self._browser.is_connected():
                    logger.warning("The browser stopped answering: it is started again")
                self.stats.inc_value("render/browser_crashes")
                logger.warning("The browser crashed: its pages are rendered again in a new one")
                await self._discard()

    def alive(self, generation: int) -> bool:
        return generation == self.generation and self._browser is not None and self._browser.is_connected()

    async def close(self) -> None:
        async with self._starting:
            self._closed = True
            if self._browser is not None:
                await self._discard()
            if self._manager is not None:
                try:
                    await asyncio.wait_for(self._manager.__aexit__(None, None, None), CLOSE_TIMEOUT)
                except Exception:
                    pass
                self._manager = self._playwright = None
            if self._sink is not None:
                self._sink.close()
                self._sink = None

    # -- pages ------------------------------------------------------------------------------------

    async def open_page(self) -> tuple[Any, _Context, int]:
        """A new tab in the current context (a fresh context every ``RENDER_CONTEXT_PAGES``);
        raises BrowserCrashed, the browser discarded, when it cannot open one."""
        browser = await self._ensure()
        generation = self.generation
        try:
            return await self._open_page(browser, generation)
        except Exception as exc:
            await self.crashed(generation, force=True)
            raise BrowserCrashed() from exc

    async def _open_page(self, browser: Any, generation: int) -> tuple[Any, _Context, int]:
        async with self._switching:  # one new context at a time; the others wait for it
            holder = self._context
            if holder is None or holder.served >= self.conf.context_pages:
                if holder is not None:
                    holder.retiring = True
                    self.stats.inc_value("render/contexts_recycled")
                    if holder.open == 0:
                        await _close_quietly(holder.context)
                self._context = None
                # A dead browser may leave a call unanswered, not failed: bounded, as is the new tab.
                context = await asyncio.wait_for(self._new_context(browser), OPEN_TIMEOUT)
                holder = self._context = _Context(context)
                self.stats.inc_value("render/contexts")
            holder.served += 1
        holder.open += 1
        try:
            page = await asyncio.wait_for(holder.context.new_page(), OPEN_TIMEOUT)
        except BaseException:
            await self.close_page(None, holder)
            raise
        return page, holder, generation

    async def _new_context(self, browser: Any) -> Any:
        context = await browser.new_context(service_workers="block", java_script_enabled=True)
        await context.add_init_script(NO_WEBRTC)
        await context.route("**/*", self.guard.route)
        await context.route_web_socket("**/*", self.guard.websocket)
        context.on("page", _close_if_popup)
        return context

    async def close_page(self, page: Any, holder: _Context) -> None:
        if page is not None:
            await _close_quietly(page)
        holder.open -= 1
        if holder.retiring and holder.open == 0:
            await _close_quietly(holder.context)


class _Sink:
    """A local port that takes the browser's own connections and closes them unread, counted
    (``render/unrouted_connections``)."""

    def __init__(self, server: Any, stats: Any) -> None:
        self.server = server
        self.stats = stats
        self.port = server.sockets[0].getsockname()[1]

    @classmethod
    async def start(cls, stats: Any) -> _Sink:
        holder: list[_Sink] = []

        def taken(reader: Any, writer: Any) -> None:
            holder[0].stats.inc_value("render/unrouted_connections")
            writer.close()

        server = await asyncio.start_server(taken, "127.0.0.1", 0)
        holder.append(cls(server, stats))
        return holder[0]

    def close(self) -> None:
        self.server.close()


async def _close_if_popup(page: Any) -> None:
    # A page a script opened (window.open): nobody renders it; closed before it loads much.
    try:
        if await page.opener() is not None:
            await page.close()
    except Exception:
        pass


async def _close_quietly(target: Any) -> None:
    try:
        await asyncio.wait_for(target.close(), CLOSE_TIMEOUT)
    except Exception:
        pass
