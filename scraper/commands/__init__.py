"""Operator commands (``COMMANDS_MODULE``): crawl, demo, seed, migrate, queue, runs."""

from __future__ import annotations

import sys
from typing import Any

from .. import backends
from ..config import ConfigError


def backends_or_report(command: Any, need_postgres: bool = True) -> backends.Backends | None:
    """Resolve Redis and Postgres (or Redis alone) for an operator command; on a bad setting,
    print the one-line error, set exit status 2 and return None."""
    try:
        return backends.apply(command.settings, priority="cmdline", need_postgres=need_postgres)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        command.exitcode = 2
        return None


class SpiderName:
    """Just enough of a spider for the queue objects an operator command builds: a name."""

    def __init__(self, name: str) -> None:
        self.name = name
