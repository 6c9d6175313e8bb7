"""``scrapy parse``, whose ``--pipelines`` shows what the item pipelines make of each item.

Scrapy's own command hands the items to the pipelines without waiting and shows them as the
callback yielded them. Here the items are shown as yielded, then, with ``--pipelines``, each one
as cleaned with its verdict: valid (a crawl would store it) or rejected, with the reasons. Like
every command but ``crawl``, nothing is stored (see :mod:`scraper.shared_state`).
"""

from __future__ import annotations

import copy
from argparse import Namespace
from typing import Any

from itemadapter import ItemAdapter
from scrapy.commands.parse import Command as ScrapyParse
from scrapy.exceptions import DropItem
from scrapy.utils import display
from scrapy.utils.defer import deferred_from_coro

from ..pipelines.preview import verdict


class Command(ScrapyParse):
    def __init__(self) -> None:
        super().__init__()
        self.verdicts: list[tuple[Any, str]] = []

    def scraped_data(self, args: tuple) -> Any:
        items, requests, opts, depth, spider, callback = args
        if not opts.pipelines:
            return super().scraped_data(args)
        # Shown as yielded: the pipelines change items in place.
        as_yielded = [copy.deepcopy(item) for item in items]
        plain = Namespace(**{**vars(opts), "pipelines": False})
        d = deferred_from_coro(self._through_pipelines(items))
        d.addCallback(
            lambda _: super(Command, self).scraped_data((as_yielded, requests, plain, depth, spider, callback))
        )
        return d

    async def _through_pipelines(self, items: list[Any]) -> None:
        itemproc = self.pcrawler.engine.scraper.itemproc
        for item in items:
            try:
                processed = await itemproc.process_item_async(item)
            except DropItem as exc:
                self.verdicts.append((item, verdict(item, str(exc))))
            else:
                self.verdicts.append((processed, verdict(processed)))

    def print_results(self, opts: Namespace) -> None:
        super().print_results(opts)
        if not opts.pipelines or opts.noitems:
            return
        print("# Item pipelines (nothing stored) ", "-" * 42)
        display.pprint(
            [{"verdict": verdict, "item": ItemAdapter(item).asdict()} for item, verdict in self.verdicts],
            colorize=not opts.nocolour,
        )
