"""``scrapy genspider``, making a spider that crawls from a URL, a host or a host:port.

Scrapy's own command puts the port into ``allowed_domains`` (where the offsite middleware
matches no page at all, so the crawl ends with 0 pages) and turns ``127.0.0.1:8000`` into an
https URL, or ``localhost:8000`` into no URL. Here ``allowed_domains`` holds the host name only,
a start URL keeps the scheme it was given, a bare host gets https and a bare host:port on a
loopback address (a site served on this machine) http.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from scrapy.commands.genspider import Command as ScrapyGenspider
from scrapy.exceptions import UsageError

LOOPBACK_NAMES = {"localhost", "localhost.localdomain"}


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def start_url(target: str) -> str:
    """The start URL for *target*: a URL as given, a bare host or host:port made into one."""
    target = target.strip()
    if "://" in target:
        parts = urlsplit(target)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(
                f"<domain>: expected a host, host:port or an http(s) URL, got {target!r}", print_help=False
            )
        return target
    parts = urlsplit(f"//{target}")
    try:
        port = parts.port
    except ValueError:
        raise UsageError(f"<domain>: bad port in {target!r}", print_help=False) from None
    if not parts.hostname:
        raise UsageError(f"<domain>: expected a host, host:port or an http(s) URL, got {target!r}", print_help=False)
    scheme = "http" if port is not None and _is_loopback(parts.hostname) else "https"
    return f"{scheme}://{target}"


def allowed_domain(url: str) -> str:
    """What the offsite middleware compares with: the host name, without port or credentials."""
    return urlsplit(url).hostname or ""


class Command(ScrapyGenspider):
    def run(self, args: list[str], opts: Any) -> None:
        if len(args) == 2 and not (opts.list or opts.dump):
            args = [args[0], start_url(args[1])]
        super().run(args, opts)

    def _generate_template_variables(self, module: str, name: str, url: str, template_name: str) -> dict[str, Any]:
        variables = super()._generate_template_variables(module, name, url, template_name)
        variables["domain"] = allowed_domain(url)
        return variables
