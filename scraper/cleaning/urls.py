"""URL normalisation so the same page always maps to the same string."""

from __future__ import annotations

import re
from urllib.parse import urljoin, urlsplit, urlunsplit

from w3lib.url import canonicalize_url

__all__ = ["canonical_url", "url_domain"]

_SCHEMES = frozenset({"http", "https"})
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Browsers drop tabs and newlines anywhere inside a URL (WHATWG URL spec);
# they appear when href attributes are wrapped in the HTML source.
_INNER_WS = re.compile(r"[\t\r\n]")
_BAD_HOST = re.compile(r"[\s<>\"{}|\\^`]")
# A URL already in canonical form, as most links and every URL Scrapy fetched are: lowercase
# ASCII host, a path of unreserved characters without dot segments or empty segments, no query,
# no fragment. canonicalize_url would return it unchanged, at ~15 µs a call.
_ALREADY_CANONICAL = re.compile(
    r"(https?)://[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*"
    r"(?::([1-9][0-9]{0,4}))?/[A-Za-z0-9_~./-]*"
)


def canonical_url(raw: object, base: str | None = None) -> str | None:
    """Return the canonical absolute http(s) form of ``raw``, or None.

    Relative URLs need ``base``; scheme-relative ones ("//cdn.x/a") get https
    when there is no base. The fragment is dropped, the query sorted,
    percent-encoding normalised, the host lowercased and default ports removed.
    """
    if not isinstance(raw, str):
        return None
    url = raw.strip()
    if "\t" in url or "\n" in url or "\r" in url:
        url = _INNER_WS.sub("", url)
    if not url:
        return None
    if base:
        url = urljoin(base.strip(), url)
    elif url.startswith("//"):
        url = "https:" + url
    if _already_canonical(url):
        return url
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        host = parts.hostname
        port = parts.port
    except ValueError:
        return None
    if scheme not in _SCHEMES or not host or _BAD_HOST.search(host):
        return None

    netloc = host.lower()
    if ":" in netloc:
        netloc = f"[{netloc}]"  # IPv6 literal
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        netloc = f"{netloc}:{port}"
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    if userinfo:
        netloc = f"{userinfo}@{netloc}"
    try:
        return canonicalize_url(urlunsplit((scheme, netloc, parts.path, parts.query, "")))
    except ValueError:
        return None


def _already_canonical(url: str) -> bool:
    match = _ALREADY_CANONICAL.fullmatch(url)
    if match is None or "/." in url or "//" in url[match.end(1) + 3 :] or "xn--" in url:
        return False
    port = match.group(2)
    return port is None or (int(port) <= 65535 and int(port) != _DEFAULT_PORTS[match.group(1)])


def url_domain(url: str) -> str:
    """Lowercased host of ``url`` without port or a leading "www." ("" if none)."""
    text = url.strip()
    if "://" not in text and not text.startswith("//"):
        # Bare "example.com/path" would otherwise parse as a path.
        text = "//" + text
    try:
        host = urlsplit(text).hostname or ""
    except ValueError:
        return ""
    host = host.rstrip(".")
    return host[4:] if host.startswith("www.") else host
