"""Operator commands (``COMMANDS_MODULE``): crawl, demo, seed, migrate, queue, runs, dlq, dbshell,
export; and Scrapy's genspider and parse, made to fit this project."""

from __future__ import annotations

import sys
from typing import Any

from scrapy.spiderloader import get_spider_loader

from .. import backends
from ..config import ConfigError
from ..queue import signing


def backends_or_report(
    command: Any, need_postgres: bool = True, need_redis: bool = True, signs: bool = False
) -> backends.Backends | None:
    """Resolve Redis and Postgres (or only the one needed) for an operator command; on a bad
    setting, print the one-line error, set exit status 2 and return None. *signs*: the command
    reads or writes queue entries, so a shared Redis needs the fleet's ``SCHEDULER_SECRET``."""
    try:
        found = backends.apply(command.settings, priority="cmdline", need_postgres=need_postgres, need_redis=need_redis)
        if signs:
            signing.check(command.settings)
        return found
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        command.exitcode = 2
        return None


def report_error(command: Any, message: str, status: int = 2) -> None:
    """One line on stderr and an exit status: how every operator command reports user errors."""
    print(f"error: {message}", file=sys.stderr)
    command.exitcode = status


def spider_or_report(command: Any, name: str) -> type | None:
    """The spider class called *name*; if there is none, one line (as ``crawl`` says it) and None."""
    try:
        return get_spider_loader(command.settings).load(name)
    except KeyError:
        report_error(command, f"Spider not found: {name} (scrapy list shows the spiders)")
        return None


class SpiderName:
    """Just enough of a spider for the queue objects an operator command builds: a name."""

    def __init__(self, name: str) -> None:
        self.name = name
