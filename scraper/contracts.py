"""Spider contracts of our own, for ``scrapy check`` (``SPIDER_CONTRACTS``).

``@page PATH`` is Scrapy's ``@url`` relative to the site the spider crawls (its ``site_url()``,
by default its first start URL), so a contract keeps working when the site moves: the demo shop
is served on whatever port is free, and a staging copy of a site has another host.

``@scrapes`` replaces Scrapy's own: a field set to None counts as missing.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urljoin

from itemadapter import ItemAdapter, is_item
from scrapy.contracts import Contract, default
from scrapy.exceptions import ContractFail


class PageContract(Contract):
    """``@page /p/1.html``: the sample page, relative to the spider's site."""

    name = "page"

    def adjust_request_args(self, args: dict[str, Any]) -> dict[str, Any]:
        if not self.args:
            raise ValueError("@page needs a path, e.g. @page /p/1.html")
        spider = getattr(args["callback"], "__self__", None)
        site = getattr(spider, "site_url", None)
        base = site() if callable(site) else (getattr(spider, "start_urls", None) or [""])[0]
        args["url"] = urljoin(base, self.args[0])
        return args


class ScrapesContract(default.ScrapesContract):
    """``@scrapes sku title``: each item has a value for these fields.

    Scrapy's own only asks that the field be set, but a spider on ``CatalogSpider`` sets every
    field, to None when its selector matched nothing: the very breakage a contract is for."""

    def post_process(self, output: list[Any]) -> None:
        for item in output:
            if is_item(item):
                adapter = ItemAdapter(item)
                missing = [name for name in self.args if adapter.get(name) in (None, "", [], {})]
                if missing:
                    raise ContractFail(f"Missing fields: {', '.join(missing)}")
