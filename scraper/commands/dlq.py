"""``scrapy dlq``: the dead letters of a spider.

scrapy dlq list <spider> [--reason PREFIX]      one line per dead letter, newest last
scrapy dlq show <spider> N [--json]             one dead letter in full, request included
scrapy dlq requeue <spider> (--all | --reason PREFIX)
                                                back into the shared queue, past the seen-set,
                                                with their retry counters reset
scrapy dlq purge <spider> [--reason PREFIX]     delete them
"""

from __future__ import annotations

import json
import sys
import time
from argparse import ArgumentParser, Namespace
from typing import Any

from scrapy.commands import ScrapyCommand

from ..backends.redis_client import get_redis
from ..queue import keys, serializer, shards, signing
from ..queue.dead_letters import DeadLetters
from . import SpiderName, backends_or_report, report_error, spider_or_report

ACTIONS = ("list", "show", "requeue", "purge")
BODY_SHOWN = 2000  # characters of a request body shown by `dlq show`


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def describe(index: int, letter: dict[str, Any]) -> str:
    """A dead letter for a human: why, how often, and the request as Scrapy would build it."""
    lines = [
        f"dead letter {index}",
        f"  reason:    {letter.get('reason')}",
        f"  attempts:  {letter.get('attempts')} in its last run; dead-lettered {letter.get('count', 1)} time(s), "
        f"last at {_when(letter.get('at', 0))}",
    ]
    try:
        # An unsigned letter may carry a forged signature: shown for what it claims, never trusted.
        request = serializer.loads(signing.unwrap(letter["request"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        lines.append(f"  unreadable request: {str(letter.get('request'))[:BODY_SHOWN]}")
        return "\n".join(lines)
    lines.append(f"  request:   {request.get('method', 'GET')} {request.get('url')}")
    for name in ("callback", "errback", "priority", "dont_filter"):
        if request.get(name) not in (None, "", False):
            lines.append(f"  {name + ':':<10} {request[name]}")
    for name, values in (request.get("headers") or {}).items():
        name = name.decode("latin-1") if isinstance(name, bytes) else name
        for value in values if isinstance(values, list) else [values]:
            value = value.decode("latin-1") if isinstance(value, bytes) else value
            lines.append(f"  header:    {name}: {value}")
    for name in ("meta", "cb_kwargs", "cookies"):
        if request.get(name):
            lines.append(f"  {name + ':':<10} {json.dumps(request[name], default=repr, ensure_ascii=False)}")
    body = request.get("body") or b""
    if body:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
        more = f" … ({len(text)} characters)" if len(text) > BODY_SHOWN else ""
        lines.append(f"  body:      {text[:BODY_SHOWN]}{more}")
    return "\n".join(lines)


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False  # no crawl: no Scrapy banner either

    def syntax(self) -> str:
        return "list|show|requeue|purge <spider> [N] [--reason PREFIX] [--all] [--json]"

    def short_desc(self) -> str:
        return "List, show, requeue and purge a spider's dead letters"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--reason", default=None, help="only dead letters whose reason starts with this")
        parser.add_argument("--all", action="store_true", help="requeue every dead letter")
        parser.add_argument("--json", action="store_true", help="show: the stored entry as JSON")

    def run(self, args: list[str], opts: Namespace) -> None:
        if len(args) < 2 or args[0] not in ACTIONS:
            return report_error(self, "usage: scrapy dlq list|show|requeue|purge <spider> ...")
        action, spider = args[0], args[1]
        if action == "show" and (len(args) != 3 or not args[2].isdigit()):
            return report_error(self, "usage: scrapy dlq show <spider> N (N from scrapy dlq list)")
        if action == "requeue" and not opts.all and not opts.reason:
            return report_error(self, "dlq requeue: say which, --all or --reason PREFIX")
        if spider_or_report(self, spider) is None:
            return
        found = backends_or_report(self, need_postgres=False, signs=True)
        if found is None:
            return
        server = get_redis(found.redis_url)
        keys.migrate_legacy(server, spider)
        letters = DeadLetters(server, SpiderName(spider), shards.for_spider(server, spider, self.settings))
        leaked = letters.purge_api_calls()
        if leaked:
            print(
                f"warning: deleted {leaked} dead letter(s) that were scraping-API calls recorded by an earlier "
                f"version: they held the API key (rotate the key if others can read this Redis)",
                file=sys.stderr,
            )
        if action == "list":
            shown = 0
            for index, letter in letters.entries():
                if opts.reason and not letter["reason"].startswith(opts.reason):
                    continue
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(letter["at"]))
                print(
                    f"{index:>5}  {when}  attempts={letter['attempts']}  count={letter.get('count', 1)}  "
                    f"{letter['reason']}  {letter['url'] or '-'}"
                )
                shown += 1
            print(f"{shown} dead letter(s) shown, {len(letters)} in all for {spider!r}")
        elif action == "show":
            wanted = int(args[2])
            for index, letter in letters.entries():
                if index == wanted:
                    print(json.dumps(letter, indent=2, ensure_ascii=False) if opts.json else describe(index, letter))
                    return
            report_error(self, f"no dead letter {wanted} for {spider!r} (scrapy dlq list {spider})", status=1)
        elif action == "requeue":
            moved = letters.requeue(None if opts.all else opts.reason)
            print(f"requeued {moved} dead letter(s) for {spider!r}; {len(letters)} left")
        else:
            purged = letters.purge(opts.reason)
            print(f"purged {purged} dead letter(s) for {spider!r}; {len(letters)} left")
