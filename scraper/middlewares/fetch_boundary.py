"""Refuse to fetch what a crawl node has no business fetching.

Whoever can write to the shared queue can hand a worker any URL. This middleware bounds what a
request may reach, whatever its origin (the spider, the queue, a redirect: a redirect comes back
through every downloader middleware as a new request, so it is checked again):

* the scheme: http and https only (``forbidden_scheme``);
* the address: the host is resolved (without blocking the reactor, cached per host) and a
  loopback, private, link-local, multicast, reserved or unspecified address is refused
  (``forbidden_address``), unless one of the networks in ``FETCH_ALLOW_NETWORKS`` holds it;
* the spider's ``allowed_domains``, when it declares any (``offsite``): Scrapy's own offsite check
  lets a request with ``dont_filter`` through, which a forged queue entry can set.

A refused request is a dead letter with its reason, counted, never downloaded. It applies also
when the scraping API fetches the page (this middleware runs before it): the provider would
reach the same internal names from its side of the proxy or leak what they answer.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import time
from typing import Any, Iterable

from scrapy import Request
from scrapy.exceptions import IgnoreRequest
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import reactor

from ..config import ConfigError
from .dead_letters import bury

logger = logging.getLogger(__name__)

ALLOWED_SCHEMES = frozenset({"http", "https"})
# Resolved addresses are kept this long: one lookup per host, not per request.
CACHE_SECONDS = 300.0

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(value: object, name: str = "FETCH_ALLOW_NETWORKS") -> list[Network]:
    """``127.0.0.0/8, 10.1.0.0/16`` (or a list) -> networks; a bad entry fails naming *name*."""
    parts: Iterable[str] = value if isinstance(value, (list, tuple)) else re.split(r"[,\s]+", str(value or ""))
    networks = []
    for part in parts:
        part = str(part).strip()
        if not part:
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ConfigError(f"{name}: expected a list of networks (CIDR), got {part!r}") from None
    return networks


def is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


class FetchBoundaryMiddleware:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.allowed_networks = parse_networks(crawler.settings.get("FETCH_ALLOW_NETWORKS", ""))
        self._resolved: dict[str, tuple[float, list[str]]] = {}
        self._allowed_domains: list[str] | None = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> "FetchBoundaryMiddleware":
        return cls(crawler)

    def address_allowed(self, text: str) -> bool:
        try:
            address = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            return False
        if is_public(address):
            return True
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self.allowed_networks)

    def _domains(self, spider: Any) -> list[str]:
        if self._allowed_domains is None:
            domains = getattr(spider, "allowed_domains", None) or []
            self._allowed_domains = [str(d).lower().lstrip(".").split(":", 1)[0] for d in domains if d]
        return self._allowed_domains

    def _offsite(self, host: str, spider: Any) -> bool:
        domains = self._domains(spider)
        if not domains:
            return False
        return not any(host == d or host.endswith("." + d) for d in domains)

    async def process_request(self, request: Request, spider: Any = None) -> None:
        spider = spider or self.crawler.spider
        parts = urlparse_cached(request)
        scheme = (parts.scheme or "").lower()
        if scheme not in ALLOWED_SCHEMES:
            self._refuse(request, "forbidden_scheme", f"{scheme or 'no'} scheme")
        host = (parts.hostname or "").lower().rstrip(".")
        if not host:
            self._refuse(request, "forbidden_address", "no host")
        if self._offsite(host, spider):
            self._refuse(request, "offsite", f"{host} is not in the spider's allowed_domains")
        for address in await self._resolve(host):
            if not self.address_allowed(address):
                self._refuse(request, "forbidden_address", f"{host} resolves to a non-public address")

    async def _resolve(self, host: str) -> list[str]:
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
            return [host]
        except ValueError:
            pass
        now = time.monotonic()
        cached = self._resolved.get(host)
        if cached and cached[0] > now:
            return cached[1]
        try:
            # Twisted's resolver: Scrapy's caching threaded one, off the reactor thread.
            address = await maybe_deferred_to_future(reactor.resolve(host))
        except Exception:
            # Unresolvable: the download fails the ordinary way (a DNS error, retried, then buried).
            return []
        addresses = [address]
        self._resolved[host] = (now + CACHE_SECONDS, addresses)
        return addresses

    def _refuse(self, request: Request, reason: str, detail: str) -> None:
        self.crawler.stats.inc_value(f"fetch_boundary/{reason}")
        if request.callback is not NO_CALLBACK:
            bury(self.crawler, request, reason, 0)
        else:
            logger.warning("Refused to fetch %s (%s: %s)", request.url, reason, detail)
        raise IgnoreRequest(f"refused ({reason}): {detail}")
