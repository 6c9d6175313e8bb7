"""What a crawl node may fetch, whatever the shared queue hands it.

Anyone who can write to the shared Redis can push requests a worker will fetch (and, through a
scraping API, pay for). So every request is checked where it is about to leave, after every
redirect too (a redirect is a new request through this middleware):

* **http(s) only**: ``file``, ``s3``, ``ftp`` and ``data`` are not even loaded in crawl nodes
  (``DOWNLOAD_HANDLERS``); a request for another scheme is a dead letter ``forbidden_scheme``;
* **public addresses only**: a host that is, or resolves to, a loopback, private, link-local
  (cloud metadata at 169.254.169.254), shared, multicast or reserved address is a dead letter
  ``forbidden_address``, unless ``FETCH_ALLOW_NETWORKS`` (CIDRs, comma-separated) names its
  network: the demo, the tests and ``make demo`` allow loopback for their own site, and so does
  the embedded default (a Redis only this machine writes to) when the setting is empty. Checked
  on every address the name resolves to (Scrapy's DNS cache then serves the download the same);
* **the spider's own domains**: with ``allowed_domains``, a request for any other host is a dead
  letter ``offsite``, even one marked ``dont_filter`` (Scrapy's offsite check lets those pass; a
  forged queue entry would mark itself so). The bundled demo spider declares none (``scrapy
  seed`` hands it other sites); ``-a allowed_domains=shop.example`` bounds it.

Verdicts are cached per host for ``DNSCACHE``-like lifetimes, so the check costs a dict lookup
per request once a host is known.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from typing import Any

from scrapy import Request
from scrapy.exceptions import IgnoreRequest
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.threads import deferToThread

from ..config import ConfigError
from ..shared_state import is_crawl_node
from .dead_letters import bury

logger = logging.getLogger(__name__)

SCHEMES = ("http", "https")
# Beyond ipaddress' is_private/is_loopback/...: what cloud providers answer on.
_METADATA = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fd00:ec2::/32"),
    ipaddress.ip_network("100.64.0.0/10"),
)
_VERDICT_TTL = 300.0
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


def allowed_networks(value: Any) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """``FETCH_ALLOW_NETWORKS`` -> networks; raises ConfigError naming it."""
    items = value if isinstance(value, (list, tuple)) else str(value or "").split(",")
    out = []
    for item in items:
        item = str(item).strip()
        if not item:
            continue
        try:
            out.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ConfigError(f"FETCH_ALLOW_NETWORKS: not a network (CIDR such as 127.0.0.0/8): {item!r}") from None
    return out


def forbidden(address: str, allowed: list[Any]) -> bool:
    """Whether *address* (an IP) is non-public and not in an allowed network."""
    ip = ipaddress.ip_address(address.strip("[]"))
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip in net for net in allowed):
        return False
    return (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or any(ip in net for net in _METADATA)
        or not ip.is_global
    )


def on_domains(host: str, domains: Any) -> bool:
    """Whether *host* is one of *domains* or a subdomain of one (ports aside, as Scrapy's
    offsite check matches them). *domains* may be a comma-separated string (``-a allowed_domains=...``)."""
    if isinstance(domains, str):
        domains = domains.split(",")
    for domain in domains:
        domain = str(domain or "").lower().strip(".")
        if domain and (host == domain or host.endswith("." + domain)):
            return True
    return False


class FetchBoundaryMiddleware:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.allowed = allowed_networks(crawler.settings.get("FETCH_ALLOW_NETWORKS", ""))
        embedded = crawler.settings.getbool("REDIS_EMBEDDED") or str(
            crawler.settings.get("REDIS_URL") or ""
        ).startswith("unix://")
        self.crawl_node = is_crawl_node(crawler.settings)
        if not self.allowed and (embedded or not self.crawl_node):
            # The embedded default: the queue is this machine's own, written by no one else, and
            # the developer's site (`make demo-site`) listens on loopback. A developer command
            # (`scrapy parse`, `shell`, `fetch`...) takes no queue entry at all: the developer
            # named the URL.
            self.allowed = list(LOOPBACK)
        self._verdicts: dict[str, tuple[str | None, float]] = {}  # host -> (reason or None, until)

    @classmethod
    def from_crawler(cls, crawler: Any) -> FetchBoundaryMiddleware:
        return cls(crawler)

    async def process_request(self, request: Request) -> None:
        url = urlparse_cached(request)
        if url.scheme not in SCHEMES:
            self._refuse(request, "forbidden_scheme", f"scheme {url.scheme or '(none)'!r} is not fetched")
        host = (url.hostname or "").lower()
        found = self._verdicts.get(host)
        if found is None or found[1] < time.monotonic():
            found = (await self._judge(host), time.monotonic() + _VERDICT_TTL)
            if len(self._verdicts) >= 10_000:  # a broad crawl meets hosts without end
                self._verdicts.clear()
            self._verdicts[host] = found
        if found[0] is not None:
            self._refuse(request, "forbidden_address", found[0])
        domains = getattr(self.crawler.spider, "allowed_domains", None)
        if domains and not on_domains(host, domains):
            self._refuse(request, "offsite", f"{host} is not among the spider's allowed_domains")

    async def _judge(self, host: str) -> str | None:
        """Why *host* may not be fetched, or None."""
        if not host:
            return "no host"
        try:
            addresses = [str(ipaddress.ip_address(host.strip("[]")))]
        except ValueError:
            addresses = await self._resolve(host)
            if not addresses:
                return None  # unresolvable: the download fails on its own, as a DNS error
        bad = [a for a in addresses if forbidden(a, self.allowed)]
        if bad:
            return (
                f"{host} is a non-public address ({', '.join(bad)}); FETCH_ALLOW_NETWORKS allows a network explicitly"
            )
        return None

    async def _resolve(self, host: str) -> list[str]:
        """Every address *host* resolves to, looked up in the thread pool as Scrapy's resolver does."""

        def lookup() -> list[str]:
            try:
                return sorted({info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})
            except OSError:
                return []

        return await maybe_deferred_to_future(deferToThread(lookup))

    def _refuse(self, request: Request, reason: str, why: str) -> None:
        self.crawler.stats.inc_value(f"fetch_boundary/{reason}")
        logger.warning("Not fetched: %s (%s)", request.url[:300], why)
        # A component's own request (robots.txt) is its own; a developer command keeps no dead letters.
        if request.callback is not NO_CALLBACK and self.crawl_node:
            bury(self.crawler, request, reason, 0)
        raise IgnoreRequest(f"{reason}: {why}")
