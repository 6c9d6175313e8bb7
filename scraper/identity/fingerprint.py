"""The request fingerprint of a page's identity, not of the link that happened to reach it.

Scrapy's fingerprint (method, canonical URL, body) of the URL after the spider's URL policy
(:mod:`.policy`) and after the aliases learnt from canonical links (:mod:`.aliases`): every link
to one page, whatever trackers, session id or known alias it carries, is one request to the
seen-set, so the page is fetched once per run. A URL with nothing to drop and no alias is
fingerprinted exactly as Scrapy's default does (the seen-sets of earlier versions stay valid).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any
from weakref import WeakKeyDictionary

from scrapy import Request
from scrapy.utils.request import RequestFingerprinter
from w3lib.url import canonicalize_url, safe_url_string

from .aliases import Aliases
from .policy import UrlPolicy, policy_for


class IdentityFingerprinter:
    def __init__(self, crawler: Any = None) -> None:
        self.crawler = crawler
        self._default = RequestFingerprinter(crawler)
        self._policy: UrlPolicy | None = None
        self.aliases = Aliases()
        # Fingerprints of requests whose identity is another URL, computed once per request (as
        # Scrapy caches its own): a link is fingerprinted several times on its way to the queue.
        self._cache: WeakKeyDictionary[Request, bytes] = WeakKeyDictionary()

    @classmethod
    def from_crawler(cls, crawler: Any) -> IdentityFingerprinter:
        return cls(crawler)

    @property
    def policy(self) -> UrlPolicy:
        # The spider's policy: the fingerprinter is built before the spider, and used after.
        if self._policy is None:
            spider = getattr(self.crawler, "spider", None) if self.crawler is not None else None
            settings = self.crawler.settings if self.crawler is not None else {}
            policy = policy_for(settings, spider)
            if spider is None:
                return policy
            self._policy = policy
        return self._policy

    def identity(self, url: str) -> str:
        """The URL of the page *url* names: policy applied, then a known alias resolved."""
        url = self.policy.apply(url)
        return self.aliases.resolve(url)

    def fingerprint(self, request: Request) -> bytes:
        url = self.identity(request.url)
        if url == request.url or request.meta.get("verbatim_url"):
            return self._default.fingerprint(request)
        found = self._cache.get(request)
        if found is None:
            found = self._cache[request] = scrapy_fingerprint(request.method, url, request.body)
        return found

    def url_fingerprint(self, url: str, request: Request | None = None) -> bytes:
        """:meth:`fingerprint` of ``Request(url)`` (a GET without a body), without building the
        request; *request*: one that may already be for *url* (a page whose canonical link is
        its own URL), whose fingerprint Scrapy has cached since the link was queued."""
        if (
            request is not None
            and url == request.url
            and request.method == "GET"
            and not request.body
            and not request.meta.get("verbatim_url")
            and self.identity(url) == url
        ):
            # A Request's URL is escaped already (escaping it again changes nothing), and is its
            # own identity: Scrapy's fingerprint of it, as for Request(url).
            return self._default.fingerprint(request)
        # The URL as Request escapes it (its default encoding); the fingerprint is then Scrapy's
        # of its identity, whether or not that is the URL itself.
        return scrapy_fingerprint("GET", self.identity(safe_url_string(url, "utf-8")), None)


def scrapy_fingerprint(method: str, url: str, body: bytes | None) -> bytes:
    """Scrapy's default fingerprint (``scrapy.utils.request.fingerprint``, no headers, no
    fragment) of a request for *url*, without building that request (``Request.replace`` cost
    more than the fingerprint itself)."""
    data = {"method": method, "url": canonicalize_url(url), "body": (body or b"").hex(), "headers": {}}
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).digest()  # noqa: S324
