"""The download handler of http(s): Scrapy's (with our connection pool), plus the browser for a
request the render middleware marked.

A download handler, not a middleware that answers in ``process_request``: the downloader's slot
(per-domain concurrency, ``DOWNLOAD_DELAY``, AutoThrottle) holds a rendered page as any other, and
every downloader middleware (the fetch boundary, politeness, retries, redirects, the archive, the
dead letters) sees it as any other download. An unmarked request costs one dict lookup; the
browser is started, and Playwright imported, by the first marked one.
"""

from __future__ import annotations

from typing import Any

from scrapy import Request
from scrapy.http import HtmlResponse, Response

from ..downloader.http import PooledHTTPDownloadHandler
from .config import read_config
from .spec import RenderSpec

#: private meta key: the parsed spec of a request to render (set by the render middleware).
SPEC_META = "_render_spec"


class RenderingDownloadHandler(PooledHTTPDownloadHandler):
    def __init__(self, crawler: Any) -> None:
        super().__init__(crawler)
        self._crawler = crawler
        self._renderer: Any = None

    async def download_request(self, request: Request) -> Response:
        spec = request.meta.get(SPEC_META)
        response = await super().download_request(request)
        if spec is None or not isinstance(response, HtmlResponse) or not 200 <= response.status < 300:
            return response
        return await self._get_renderer().render(request, response, RenderSpec(**spec))

    def _get_renderer(self) -> Any:
        if self._renderer is None:
            from .renderer import Renderer

            self._renderer = Renderer(self._crawler, read_config(self._crawler.settings))
        return self._renderer

    async def close(self) -> None:
        await super().close()
        if self._renderer is not None:
            await self._renderer.close()
