"""Which domains go through the API: ``always``, ``never`` or ``on_block``.

``SCRAPING_API_ROUTING`` is a comma-separated list of ``domain=route``; a rule for
``example.com`` also covers its subdomains, the longest matching rule wins, and
``SCRAPING_API_DEFAULT_ROUTE`` covers the rest. ``on_block`` fetches directly first and moves a
domain to the API, for the rest of the crawl, as soon as it answers like a block: a status in
``SCRAPING_API_BLOCK_STATUSES`` or a body matching ``SCRAPING_API_BLOCK_PATTERN``.
"""

from __future__ import annotations

import re

from ..config import ConfigError, domain_entries

ROUTES = ("always", "never", "on_block")

DEFAULT_BLOCK_PATTERN = (
    r"g-recaptcha|h-captcha|hcaptcha\.com|cf-chl-|challenge-platform|/cdn-cgi/challenge|px-captcha"
    r"|<title>\s*(?:Attention Required|Just a moment|Access Denied)"
)


def parse_routing(value: object, name: str = "SCRAPING_API_ROUTING") -> dict[str, str]:
    pairs = domain_entries(value, name, "domain=route", separators=",;")
    rules: dict[str, str] = {}
    for domain, route in pairs:
        domain, route = str(domain).strip().lower().lstrip("."), str(route).strip().lower()
        if not domain:
            raise ConfigError(f"{name}: empty domain in {value!r}")
        if route not in ROUTES:
            raise ConfigError(f"{name}: route for {domain} must be one of {', '.join(ROUTES)}, got {route!r}")
        rules[domain] = route
    return rules


def route_for(host: str, rules: dict[str, str], default: str) -> str:
    host = (host or "").lower().rstrip(".")
    best, best_len = default, -1
    for domain, route in rules.items():
        if (host == domain or host.endswith("." + domain)) and len(domain) > best_len:
            best, best_len = route, len(domain)
    return best


def parse_statuses(value: object, name: str = "SCRAPING_API_BLOCK_STATUSES") -> frozenset[int]:
    items = value if isinstance(value, (list, tuple, set, frozenset)) else str(value or "").split(",")
    try:
        return frozenset(int(str(v).strip()) for v in items if str(v).strip())
    except ValueError:
        raise ConfigError(f"{name}: expected comma-separated HTTP statuses, got {value!r}") from None


def compile_pattern(value: object, name: str = "SCRAPING_API_BLOCK_PATTERN") -> re.Pattern[bytes] | None:
    if not value:
        return None
    try:
        return re.compile(str(value).encode("utf-8"), re.IGNORECASE)
    except re.error as exc:
        raise ConfigError(f"{name}: not a regular expression: {exc}") from None
