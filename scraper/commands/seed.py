"""``scrapy seed <spider> <url-or-file>...``: put start URLs into a spider's shared queue.

Arguments are URLs, or files with one URL per line (``-`` reads standard input; blank lines and
``#`` comments are skipped). Seeds are queued for the spider's ``parse`` callback and claimed in
the crawl's seen-set, as a link found by a crawl is, so a seeded page is not fetched again when
a crawl finds a link to it; a URL already seen in this run is not queued again, and said so
(``--force`` queues it anyway). Run it once, then start any number of ``scrapy crawl <spider>``
processes on any machine: they all take work from the same queue.
"""

from __future__ import annotations

import sys
from argparse import ArgumentParser, Namespace
from collections.abc import Iterator
from pathlib import Path

import scrapy
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from scrapy.utils.misc import load_object
from w3lib.url import is_url

from ..backends.redis_client import get_redis
from ..config import ConfigError
from ..queue import keys, shards
from ..queue.dupefilter import make_stores
from ..queue.keys import queue_key
from ..queue.queues import PriorityQueue, score_for
from . import backends_or_report, report_error, spider_or_report


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
    requires_crawler_process = False  # no crawl: no Scrapy banner either

    def syntax(self) -> str:
        return "<spider> <url-or-file>..."

    def short_desc(self) -> str:
        return "Queue start URLs for a spider in the shared Redis queue"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--priority", type=int, default=0, help="priority of the seeded requests")
        parser.add_argument(
            "--force", action="store_true", help="queue URLs already seen in this run too (they are crawled again)"
        )

    def run(self, args: list[str], opts: Namespace) -> None:
        if len(args) < 2:
            return report_error(
                self, "usage: scrapy seed <spider> <url-or-file>...: give a spider and at least one URL or file"
            )
        name, sources = args[0], args[1:]
        spidercls = spider_or_report(self, name)
        if spidercls is None:
            return
        try:
            urls = list(read_urls(sources))  # all or nothing: a typo on line 900 queues no half list
        except UsageError as exc:
            return report_error(self, str(exc))
        found = backends_or_report(self, need_postgres=False, signs=True)
        if found is None:
            return
        spider = spidercls.__new__(spidercls)  # only its name and methods are needed, not a crawl
        spider.name = name
        server = get_redis(found.redis_url)
        keys.migrate_legacy(server, name)
        try:
            frontier = shards.for_spider(server, name, self.settings)
            stores = make_stores(server, name, self.settings, frontier)
        except ConfigError as exc:
            return report_error(self, str(exc))
        # The crawl's own fingerprints, so that a seed and a link to the same page are one page.
        fingerprinter = load_object(self.settings["REQUEST_FINGERPRINTER_CLASS"])()
        queue = PriorityQueue(server, spider, queue_key(name), shards=frontier)
        queued = seen = 0
        repeated: list[str] = []
        # Pipelined in chunks: one round trip per thousand URLs instead of one per URL.
        pipe = server.pipeline(transaction=False)
        chunk: list[str] = []

        def send() -> None:
            nonlocal queued, seen
            results = pipe.execute()
            claims = results[::2] if opts.force else results  # with --force: claim, push, claim, push…
            for url, new in zip(chunk, claims):
                if not new:
                    seen += 1
                    if len(repeated) < 5:
                        repeated.append(url)
                if new or opts.force:
                    queued += 1
            chunk.clear()

        for done, url in enumerate(urls, 1):
            request = scrapy.Request(url, callback=spider.parse, priority=opts.priority)
            data = queue._encode_request(request)
            score = score_for(opts.priority)
            # Claimed, and queued if new, in one atomic step, as the scheduler does with links.
            shard = frontier.of_url(url)
            fingerprint = fingerprinter.fingerprint(request).hex()
            if opts.force:  # claimed (so that no link queues it again), and queued whatever the claim said
                stores[shard].add_to(pipe, fingerprint)
                queue.lists.push(queue.keys[shard], [(data, score)], client=pipe)
            else:
                stores[shard].push_if_new(pipe, fingerprint, queue.keys[shard], score, data)
            chunk.append(url)
            if done % 1000 == 0:
                send()
            if done % 100_000 == 0:
                print(f"seed: {done}/{len(urls)} queued", flush=True)
        send()
        print(f"queued {queued} start URL(s) for {name!r}; {len(queue)} request(s) now in its queue")
        if seen:
            what = "queued again anyway (--force)" if opts.force else "not queued again (--force queues them)"
            print(
                f"{seen} URL(s) already seen in this run, {what}: "
                f"{', '.join(repeated)}{' …' if seen > len(repeated) else ''}"
            )
