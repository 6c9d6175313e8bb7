"""Which limits apply to which host: the ``POLITENESS_*`` settings, a spider's own, overrides.

``POLITENESS_RATE`` (requests per second) and ``POLITENESS_CONCURRENCY`` (requests in flight)
are the fleet-wide limits of every host; 0 means no limit. A spider's ``politeness`` attribute
(``{"rate": 2, "concurrency": 4}``, either key optional) replaces them for that spider's requests.

``POLITENESS_OVERRIDES`` sets limits for chosen domains, and wins over both::

    shop.test=rate:2/concurrency:4,slow.test=rate:0.5,cdn.test=rate:0

Entries are separated by commas, limits within an entry by ``/`` (no shell quoting needed). An
entry names only the limits it changes; the others stay the default, and 0 lifts a limit. An
override for ``example.com`` covers ``www.example.com`` and every other subdomain; the most
specific matching entry wins. All hosts matched by one entry share one budget, kept under the
entry's domain: ``example.com=rate:2`` means 2 requests per second to the whole site, not 2 per
subdomain. A host matched by no entry has a budget of its own.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, field
from typing import Any

from scrapy.settings import BaseSettings

from ..config import ConfigError, domain_entries, get_bool, get_float, get_int
from ..scraping_api.routing import DEFAULT_BLOCK_PATTERN, compile_pattern

OVERRIDES = "POLITENESS_OVERRIDES"
KINDS = ("rate", "concurrency")
SYNTAX = "domain=rate:N/concurrency:N, comma-separated"

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?"
_HOST = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


@dataclass(frozen=True)
class Limit:
    """Limits set by one layer; ``None`` leaves the layer below in force."""

    rate: float | None = None
    concurrency: int | None = None

    def over(self, base: Limit) -> Limit:
        return Limit(
            self.rate if self.rate is not None else base.rate,
            self.concurrency if self.concurrency is not None else base.concurrency,
        )

    def __str__(self) -> str:
        rate = f"{self.rate:g}/s" if self.rate else "none"
        return f"rate {rate}, concurrency {self.concurrency or 'none'}"


@dataclass(frozen=True)
class DomainLimit:
    """The limits of one request's host, and the domain whose budget they are counted in."""

    domain: str
    rate: float
    concurrency: int
    # An override lifted the rate (``rate:0``): the operator says the site takes anything, so it
    # gets no slow start either.
    unlimited: bool = False

    @property
    def active(self) -> bool:
        return self.rate > 0 or self.concurrency > 0


@dataclass(frozen=True)
class Adaptive:
    """``POLITENESS_ADAPTIVE*`` and ``POLITENESS_THROTTLED_MAX_WAIT`` (see :mod:`.adaptive`)."""

    enabled: bool = True
    decrease: float = 0.7
    increase: float = 1.0
    min_rate: float = 0.1
    throttled_max_wait: float = 600.0
    # A site with no declared rate starts at slow_start_rate (0: at full speed), multiplied by
    # slow_start_growth each second (see .slow_start).
    slow_start_rate: float = 4.0
    slow_start_growth: float = 2.0
    # A 403 whose body matches is a throttle answer too (a bot wall's challenge); None: never.
    block_pattern: re.Pattern[bytes] | None = None


@dataclass
class Policy:
    default: Limit
    overrides: dict[str, Limit]
    max_wait: float = 60.0
    adaptive: Adaptive = field(default_factory=Adaptive)
    _cache: dict[str, DomainLimit] = field(default_factory=dict, repr=False, compare=False)

    @property
    def limits_anything(self) -> bool:
        layers = [self.default, *self.overrides.values()]
        return any((layer.rate or 0) > 0 or (layer.concurrency or 0) > 0 for layer in layers)

    def for_host(self, host: str) -> DomainLimit:
        found = self._cache.get(host)
        if found is None:
            if len(self._cache) >= 10_000:  # a broad crawl meets hosts without end
                self._cache.clear()
            found = self._cache[host] = self._match(host)
        return found

    def _match(self, host: str) -> DomainLimit:
        host = (host or "").lower().rstrip(".")
        domain = match_domain(host, self.overrides)
        limit = self.overrides[domain].over(self.default) if domain else self.default
        unlimited = domain is not None and self.overrides[domain].rate == 0
        return DomainLimit(domain or host, float(limit.rate or 0.0), int(limit.concurrency or 0), unlimited)

    def describe(self) -> str:
        text = f"default {self.default}"
        if self.overrides:
            text += "; " + "; ".join(f"{d}: {o.over(self.default)}" for d, o in sorted(self.overrides.items()))
        return text


def match_domain(host: str, domains: Any) -> str | None:
    """The most specific of *domains* that is *host* or a parent domain of it, if any."""
    best = None
    for domain in domains:
        if (host == domain or host.endswith("." + domain)) and (best is None or len(domain) > len(best)):
            best = domain
    return best


def parse_overrides(value: object, name: str = OVERRIDES) -> dict[str, Limit]:
    """``shop.test=rate:2/concurrency:4,...`` (or a dict of the same) -> {domain: Limit}."""
    entries = domain_entries(value, name, SYNTAX)
    overrides: dict[str, Limit] = {}
    for raw_domain, spec in entries:
        domain = _domain(raw_domain, name)
        if domain in overrides:
            raise ConfigError(f"{name}: {domain} is listed twice")
        overrides[domain] = parse_limit(spec, f"{name}: {domain}")
    return overrides


def parse_limit(spec: object, where: str) -> Limit:
    """``rate:2/concurrency:4`` or ``{"rate": 2, "concurrency": 4}`` -> Limit; *where* prefixes errors."""
    if isinstance(spec, dict):
        pairs = [(str(k), v) for k, v in spec.items()]
    else:
        pairs = []
        for item in str(spec or "").split("/"):
            item = item.strip()
            kind, sep, number = item.partition(":")
            if not sep:
                raise ConfigError(f"{where}: expected rate:N or concurrency:N, got {item!r}")
            pairs.append((kind, number))
    if not pairs:
        raise ConfigError(f"{where}: no limit given (expected rate:N and/or concurrency:N)")
    found: dict[str, Any] = {}
    for kind, number in pairs:
        kind = kind.strip().lower()
        if kind not in KINDS:
            raise ConfigError(f"{where}: unknown limit {kind!r} (expected rate or concurrency)")
        if kind in found:
            raise ConfigError(f"{where}: {kind} given twice")
        found[kind] = _rate(number, where) if kind == "rate" else _concurrency(number, where)
    return Limit(found.get("rate"), found.get("concurrency"))


def _unset_is(value: Any, default: str) -> Any:
    """An unset setting (None) takes the default; ``off`` (or empty) turns it off."""
    if value is None:
        return default
    return "" if str(value).strip().lower() == "off" else value


def read_policy(settings: BaseSettings, spider: Any = None) -> Policy:
    """Every ``POLITENESS_*`` setting (and the spider's ``politeness``), checked; ConfigError names a bad one."""
    rate = get_float(settings, "POLITENESS_RATE", 0.0, minimum=0)
    if not math.isfinite(rate):
        raise ConfigError(f"POLITENESS_RATE: expected a finite number, got {settings.get('POLITENESS_RATE')!r}")
    default = Limit(rate, get_int(settings, "POLITENESS_CONCURRENCY", 0, minimum=0))
    # Below a second a saturated domain would turn waiting requests into a polling loop.
    max_wait = get_float(settings, "POLITENESS_MAX_WAIT", 60.0, minimum=1)
    overrides = parse_overrides(settings.get(OVERRIDES) or "")
    own = getattr(spider, "politeness", None) if spider is not None else None
    if own:
        default = parse_limit(own, f"{getattr(spider, 'name', 'spider')}.politeness").over(default)
    decrease = get_float(settings, "POLITENESS_ADAPTIVE_DECREASE", 0.7, minimum=0.05)
    if decrease >= 1:
        raise ConfigError(
            f"POLITENESS_ADAPTIVE_DECREASE: must be below 1 (the share a throttled rate keeps), got {decrease:g}"
        )
    growth = get_float(settings, "POLITENESS_SLOW_START_GROWTH", 2.0, minimum=1)
    if growth <= 1 or not math.isfinite(growth):
        raise ConfigError(
            "POLITENESS_SLOW_START_GROWTH: must be a finite number above 1 (the factor the rate grows by each "
            f"second), got {settings.get('POLITENESS_SLOW_START_GROWTH')!r}"
        )
    start = get_float(settings, "POLITENESS_SLOW_START_RATE", 4.0, minimum=0)
    if not math.isfinite(start):
        raise ConfigError(
            f"POLITENESS_SLOW_START_RATE: expected a finite number, got {settings.get('POLITENESS_SLOW_START_RATE')!r}"
        )
    adaptive = Adaptive(
        enabled=get_bool(settings, "POLITENESS_ADAPTIVE", True),
        decrease=decrease,
        increase=get_float(settings, "POLITENESS_ADAPTIVE_INCREASE", 1.0, minimum=0.001),
        min_rate=get_float(settings, "POLITENESS_ADAPTIVE_MIN_RATE", 0.1, minimum=0.001),
        throttled_max_wait=get_float(settings, "POLITENESS_THROTTLED_MAX_WAIT", 600.0, minimum=1),
        slow_start_rate=start,
        slow_start_growth=growth,
        block_pattern=compile_pattern(
            _unset_is(settings.get("POLITENESS_BLOCK_PATTERN"), DEFAULT_BLOCK_PATTERN), "POLITENESS_BLOCK_PATTERN"
        ),
    )
    return Policy(default, overrides, max_wait, adaptive)


def _domain(raw: object, name: str) -> str:
    domain = str(raw).strip().lower().strip(".")
    if not domain:
        raise ConfigError(f"{name}: empty domain in an entry (expected {SYNTAX})")
    if _HOST.fullmatch(domain):
        return domain
    try:
        return str(ipaddress.ip_address(domain.strip("[]")))
    except ValueError:
        raise ConfigError(f"{name}: not a host name: {str(raw).strip()!r} (no scheme, port or path)") from None


def _rate(value: object, where: str) -> float:
    try:
        rate = float(str(value).strip())
    except ValueError:
        rate = math.nan
    if not math.isfinite(rate) or rate < 0:
        raise ConfigError(f"{where}: rate must be a number of requests per second >= 0, got {value!r}")
    return rate


def _concurrency(value: object, where: str) -> int:
    try:
        concurrency = int(str(value).strip())
    except ValueError:
        concurrency = -1
    if concurrency < 0:
        raise ConfigError(f"{where}: concurrency must be a whole number >= 0, got {value!r}")
    return concurrency
