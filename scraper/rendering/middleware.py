"""Marks the requests to render: a request's ``render`` meta key, else its spider's ``render``
attribute (see :mod:`.spec`).

Between the revisit's validators (700) and politeness (720) and the scraping API (725): a marked
request is rendered by this node's browser, so the API leaves it alone (``scraping_api: False``),
and is asked without the revisit's validators (its document's say nothing of its scripts' data);
a spider that wants the API's rendering asks the API for it (``scraping_api = {"render_js":
True}``) and marks nothing. Scrapy's own requests (robots.txt) are never rendered.
"""

from __future__ import annotations

import logging
from typing import Any

from scrapy import Request
from scrapy.http.request import NO_CALLBACK

from ..revisit.conditional import CONDITIONAL_META
from . import RENDER_META
from .config import read_config
from .handler import SPEC_META
from .spec import RenderSpec, parse_spec

logger = logging.getLogger(__name__)

API_META = "scraping_api"
VALIDATORS = (b"If-None-Match", b"If-Modified-Since")


class RenderMiddleware:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        spider = crawler.spider
        # Checked at start, named when bad: the spider's default spec and every RENDER_* setting.
        self.default: RenderSpec | None = parse_spec(
            getattr(spider, RENDER_META, None), f"{type(spider).__name__}.{RENDER_META}"
        )
        read_config(crawler.settings)
        self._specs: dict[str, RenderSpec | None] = {}
        if self.default is not None:
            logger.info("Rendering the pages of %s in a browser (%s)", spider.name, self.default)

    @classmethod
    def from_crawler(cls, crawler: Any) -> RenderMiddleware:
        return cls(crawler)

    def process_request(self, request: Request) -> None:
        meta = request.meta
        value = meta.get(RENDER_META, self.default)
        if value is None or value is False or request.callback is NO_CALLBACK:
            return None
        spec = value if isinstance(value, RenderSpec) else self._parse(value)
        if spec is None:
            return None
        # Plain data: the request may yet be queued again as JSON (a retry, a dead letter).
        meta[SPEC_META] = spec.as_meta()
        meta[API_META] = False
        if meta.pop(CONDITIONAL_META, None) is not None:
            # The validators of a rendered page's document say nothing of the data its scripts
            # fetch: a 304 for the shell would keep changed products unseen. Asked in full.
            for name in VALIDATORS:
                request.headers.pop(name, None)
            self.crawler.stats.inc_value("render/unconditional")
        return None

    def _parse(self, value: Any) -> RenderSpec | None:
        key = repr(value)
        if key not in self._specs:
            if len(self._specs) >= 1000:
                self._specs.clear()
            self._specs[key] = parse_spec(value, f"the request's {RENDER_META!r} meta")
        return self._specs[key]
