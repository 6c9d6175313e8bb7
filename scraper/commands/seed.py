"""``scrapy seed <spider> <url-or-file>...``: put start URLs into a spider's shared queue.

Arguments are URLs, or files with one URL per line (``-`` reads standard input; blank lines and
``#`` comments are skipped). Seeds are queued for the spider's ``parse`` callback and bypass
the seen-set, so seeding a URL again crawls it again. Run it once, then start any number of
``scrapy crawl <spider>`` processes on any machine: they all take work from the same queue.
"""

from __future__ import annotations

import sys
from argparse import ArgumentParser, Namespace
from pathlib import Path
from typing import Iterator

import scrapy
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from scrapy.spiderloader import get_spider_loader
from w3lib.url import is_url

from . import backends_or_report
from ..queue.keys import queue_key
from ..queue.queues import PriorityQueue
from ..redis_client import get_redis


def read_urls(sources: list[str]) -> Iterator[str]:
    for source in sources:
        if is_url(source):
            yield source
            continue
        if source == "-":
            lines = sys.stdin.read().splitlines()
        else:
            path = Path(source)
            if not path.is_file():
                raise UsageError(f"{source!r} is neither an http(s) URL nor a readable file")
            lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if not is_url(line):
                raise UsageError(f"{source}:{number}: not a URL: {line!r}")
            yield line


class Command(ScrapyCommand):
    requires_project = True

    def syntax(self) -> str:
        return "<spider> <url-or-file>..."

    def short_desc(self) -> str:
        return "Queue start URLs for a spider in the shared Redis queue"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--priority", type=int, default=0, help="priority of the seeded requests")

    def run(self, args: list[str], opts: Namespace) -> None:
        if len(args) < 2:
            raise UsageError("give a spider name and at least one URL or file")
        name, sources = args[0], args[1:]
        spidercls = get_spider_loader(self.settings).load(name)
        found = backends_or_report(self, need_postgres=False)
        if found is None:
            return
        spider = spidercls.__new__(spidercls)  # only its name and methods are needed, not a crawl
        spider.name = name
        server = get_redis(found.redis_url)
        urls = list(read_urls(sources))  # all or nothing: a typo on line 900 queues no half list
        # Pipelined in chunks: one round trip per thousand URLs instead of one per URL.
        pipe = server.pipeline(transaction=False)
        batch = PriorityQueue(pipe, spider, queue_key(name))
        for done, url in enumerate(urls, 1):
            batch.push(scrapy.Request(url, callback=spider.parse, dont_filter=True, priority=opts.priority))
            if done % 1000 == 0:
                pipe.execute()
            if done % 100_000 == 0:
                print(f"seed: {done}/{len(urls)} queued", flush=True)
        pipe.execute()
        queue = PriorityQueue(server, spider, queue_key(name))
        print(f"queued {len(urls)} start URL(s) for {name!r}; {len(queue)} request(s) now in its queue")
