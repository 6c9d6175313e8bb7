"""``scrapy dlq``: the dead letters of a spider.

    scrapy dlq list <spider> [--reason PREFIX]      one line per dead letter, newest last
    scrapy dlq show <spider> N                      one dead letter in full, request included
    scrapy dlq requeue <spider> (--all | --reason PREFIX)
                                                    back into the shared queue, past the seen-set
"""

from __future__ import annotations

import json
import sys
import time
from argparse import ArgumentParser, Namespace

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from ..queue.dead_letters import DeadLetters
from ..redis_client import get_redis
from . import SpiderName, backends_or_report



class Command(ScrapyCommand):
    requires_project = True

    def syntax(self) -> str:
        return "list|show|requeue <spider> [N] [--reason PREFIX] [--all]"

    def short_desc(self) -> str:
        return "List, show and requeue a spider's dead letters"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--reason", default=None, help="only dead letters whose reason starts with this")
        parser.add_argument("--all", action="store_true", help="requeue every dead letter")

    def run(self, args: list[str], opts: Namespace) -> None:
        if len(args) < 2 or args[0] not in ("list", "show", "requeue"):
            raise UsageError("scrapy dlq list|show|requeue <spider> ...")
        action, spider = args[0], args[1]
        found = backends_or_report(self, need_postgres=False)
        if found is None:
            return
        letters = DeadLetters(get_redis(found.redis_url), SpiderName(spider))
        if action == "list":
            shown = 0
            for index, letter in letters.entries():
                if opts.reason and not letter["reason"].startswith(opts.reason):
                    continue
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(letter["at"]))
                print(f"{index:>5}  {when}  attempts={letter['attempts']}  {letter['reason']}  {letter['url'] or '-'}")
                shown += 1
            print(f"{shown} dead letter(s) shown, {len(letters)} in all for {spider!r}")
        elif action == "show":
            if len(args) != 3 or not args[2].isdigit():
                raise UsageError("scrapy dlq show <spider> N")
            wanted = int(args[2])
            for index, letter in letters.entries():
                if index == wanted:
                    print(json.dumps(letter, indent=2, ensure_ascii=False))
                    return
            print(f"error: no dead letter {wanted} for {spider!r}", file=sys.stderr)
            self.exitcode = 1
        else:
            if not opts.all and not opts.reason:
                raise UsageError("say which: --all, or --reason PREFIX")
            moved = letters.requeue(None if opts.all else opts.reason)
            print(f"requeued {moved} dead letter(s) for {spider!r}; {len(letters)} left")
