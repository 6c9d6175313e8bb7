"""Rendering one page: the downloader's answer goes into a browser tab, the DOM comes out.

The page itself is fetched by the downloader as any page (the fetch boundary, politeness, the
revisit's validators, the size limits, retries and redirects all apply, and count it once);
only a 2xx HTML answer is rendered. The browser gets that body as the page's document, plays the
spider's actions, and the rendered DOM becomes the response the spider (and the archive) sees,
flagged ``rendered``.

Failures: a page over ``RENDER_PAGE_TIMEOUT`` is a download timeout (retried by Scrapy's
RetryMiddleware, then a dead letter); a browser that crashed under a page is started again and the
page rendered again (``RENDER_CRASH_RETRIES``, then a failed download, retried as any); a page that
keeps showing its error (``retry_if``) is a dead letter ``render:error_box``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from scrapy import Request
from scrapy.exceptions import DownloadFailedError, DownloadTimeoutError
from scrapy.http import Headers, HtmlResponse, Response

from . import RENDERED_FLAG
from .actions import play
from .browser import Browser, BrowserCrashed
from .config import RenderConfig
from .guard import Document, Guard, PageState, document_headers, origin_of
from .spec import RenderSpec

logger = logging.getLogger(__name__)


# Past its own time budget, how long a render may take to give up (closing a page, a context).
STUCK_MARGIN = 15.0
DISCONNECT_GRACE = 0.2


class RenderError(Exception):
    """A page that cannot be rendered for good; a dead letter with its reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.dead_letter_reason = reason


class _ErrorShown(Exception):
    pass


class Renderer:
    def __init__(self, crawler: Any, conf: RenderConfig) -> None:
        self.conf = conf
        self.stats = crawler.stats
        self.guard = Guard(crawler, conf.block, conf.max_redirects, conf.page_timeout)
        self.browser = Browser(conf, self.guard, crawler.stats)

    async def close(self) -> None:
        await self.browser.close()

    async def render(self, request: Request, response: Response, spec: RenderSpec) -> Response:
        document = Document(response.url, response.status, document_headers(response.headers), response.body)
        crashes = errors = 0
        while True:
            try:
                html, url = await self._bounded(document, spec)
            except BrowserCrashed as exc:
                crashes += 1
                if crashes > self.conf.crash_retries:
                    raise DownloadFailedError(f"the browser crashed {crashes} times rendering {request.url}") from exc
                self.stats.inc_value("render/crash_retries")
                continue
            except _ErrorShown:
                errors += 1
                if errors > self.conf.error_retries:
                    self.stats.inc_value("render/error_pages")
                    raise RenderError(
                        "render:error_box", f"{request.url} showed its error ({spec.retry_if}) {errors} times"
                    ) from None
                self.stats.inc_value("render/error_retries")
                continue
            break
        headers = Headers(response.headers)
        for name in ("Content-Length", "Content-Encoding", "Transfer-Encoding"):
            headers.pop(name, None)
        headers["Content-Type"] = "text/html; charset=utf-8"
        return HtmlResponse(
            url=url if url.startswith(("http://", "https://")) else response.url,
            status=response.status,
            headers=headers,
            body=html.encode("utf-8"),
            flags=[*response.flags, RENDERED_FLAG],
            request=request,
            certificate=response.certificate,
            ip_address=response.ip_address,
            protocol=response.protocol,
        )

    async def _bounded(self, document: Document, spec: RenderSpec) -> tuple[str, str]:
        """One render, whatever happens to the browser: a browser that stops answering (a call
        that never returns, a close that hangs) is taken for crashed and started again, rather
        than holding the page, its slot and the crawl's end forever."""
        generation = self.browser.generation
        try:
            return await asyncio.wait_for(self._once(document, spec), self.conf.page_timeout + STUCK_MARGIN)
        except TimeoutError:
            self.stats.inc_value("render/stuck")
            await self.browser.crashed(max(generation, 1), force=True)
            raise BrowserCrashed() from None

    async def _once(self, document: Document, spec: RenderSpec) -> tuple[str, str]:
        from playwright.async_api import Error as PlaywrightError

        async with self.browser.slots:  # the ceiling of pages per node; waiting is not rendering
            started = time.monotonic()
            page, holder, generation = await self.browser.open_page()
            state = PageState(document, origin_of(document.url))
            self.guard.pages[page] = state
            crashed = asyncio.Event()
            page.on("crash", lambda _page: crashed.set())
            page.set_default_timeout(self.conf.page_timeout * 1000 + 1000)  # the budget below cuts first
            try:
                async with asyncio.timeout(self.conf.page_timeout):
                    await page.goto(document.url, wait_until="load")
                    if await play(page, spec, state, self.conf):
                        raise _ErrorShown()
                    html = await page.content()
                    url = page.url
            except TimeoutError:
                if await self._crashed(crashed, generation):
                    raise BrowserCrashed() from None
                self.stats.inc_value("render/timeouts")
                raise DownloadTimeoutError(
                    f"{document.url} took more than {self.conf.page_timeout:g} s to render (RENDER_PAGE_TIMEOUT)"
                ) from None
            except PlaywrightError as exc:
                if await self._crashed(crashed, generation) or page.is_closed():
                    raise BrowserCrashed() from exc
                raise DownloadFailedError(
                    f"rendering {document.url} failed: {str(exc).splitlines()[0][:300]}"
                ) from None
            finally:
                await self.browser.close_page(page, holder)
            self.stats.inc_value("render/pages")
            self.stats.inc_value("render/seconds", round(time.monotonic() - started, 3))
            return html, url

    async def _crashed(self, page_crashed: asyncio.Event, generation: int) -> bool:
        """Whether the page failed because its renderer or the whole browser died (the browser is
        then started again by the next page)."""
        if self.browser.alive(generation):
            # A killed browser fails its pages' calls a moment before it reports itself gone.
            await asyncio.sleep(DISCONNECT_GRACE)
        if not self.browser.alive(generation):
            await self.browser.crashed(generation)
            return True
        return page_crashed.is_set()
