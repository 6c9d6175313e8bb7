"""The ``QUALITY_*`` settings, read and checked in one place.

Every threshold is a setting with a default that suits a healthy crawl; a spider overrides
them the Scrapy way, in its ``custom_settings``. A bad value fails at start, by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scrapy.settings import BaseSettings

from ..config import ConfigError, get_bool, get_float, get_int

# `scrapy crawl`'s exit status for a degraded run (with QUALITY_FAIL_EXIT).
EXIT_STATUS = 3


@dataclass(frozen=True)
class QualitySettings:
    enabled: bool = True
    baseline_runs: int = 5  # the last N finished runs a run is compared with
    min_items: int = 10  # fewer stored items of a type: its coverage is not judged
    coverage_tolerance: float = 0.1  # below a field's average coverage by more than this fails
    items_drop: float = 0.2  # fewer items stored than (1 - this) x the baseline's fails
    rejects_rise: float = 0.05  # a field's share of rejected items up by more than this fails
    gone_spike: float = 0.1  # more than this share of the baseline's items gone at once fails
    pages_per_item_rise: float = 0.5  # pages per stored item up by more than this share fails
    responses_rise: float = 0.05  # share of error, blocked or empty responses up by more fails
    price_shift: float = 0.25  # a price that moved by more than this share run over run jumped
    price_jumps: float = 0.1  # more than this share of an item type's known prices jumped fails
    dead_letters: float = 0.05  # more than this share of a run's pages set aside as dead letters fails
    unreadable: float = 0.05  # more than this share of a type's items with a value the cleaner could not read fails
    fail_exit: bool = True  # `scrapy crawl` exits with status 3 when its run is degraded


def _fraction(settings: BaseSettings, name: str, default: float, top: float | None = 1.0) -> float:
    value = get_float(settings, name, default, minimum=0)
    if top is not None and value > top:
        raise ConfigError(f"{name}: must be at most {top:g}, got {value:g}")
    return value


def read_settings(settings: BaseSettings) -> QualitySettings:
    """The quality settings of a crawl; raises :class:`ConfigError` naming a bad one."""
    d = QualitySettings()
    return QualitySettings(
        enabled=get_bool(settings, "QUALITY_ENABLED", d.enabled),
        baseline_runs=get_int(settings, "QUALITY_BASELINE_RUNS", d.baseline_runs, minimum=1),
        min_items=get_int(settings, "QUALITY_MIN_ITEMS", d.min_items, minimum=0),
        coverage_tolerance=_fraction(settings, "QUALITY_COVERAGE_TOLERANCE", d.coverage_tolerance),
        items_drop=_fraction(settings, "QUALITY_ITEMS_DROP", d.items_drop),
        rejects_rise=_fraction(settings, "QUALITY_REJECTS_RISE", d.rejects_rise),
        gone_spike=_fraction(settings, "QUALITY_GONE_SPIKE", d.gone_spike),
        pages_per_item_rise=_fraction(settings, "QUALITY_PAGES_PER_ITEM_RISE", d.pages_per_item_rise, top=None),
        responses_rise=_fraction(settings, "QUALITY_RESPONSES_RISE", d.responses_rise),
        price_shift=_fraction(settings, "QUALITY_PRICE_SHIFT", d.price_shift, top=None),
        price_jumps=_fraction(settings, "QUALITY_PRICE_JUMPS", d.price_jumps),
        dead_letters=_fraction(settings, "QUALITY_DEAD_LETTERS", d.dead_letters),
        unreadable=_fraction(settings, "QUALITY_UNREADABLE", d.unreadable),
        fail_exit=get_bool(settings, "QUALITY_FAIL_EXIT", d.fail_exit),
    )


def value_shifts(item_type: type, price_shift: float) -> dict[str, float]:
    """Field -> the share its value may move by in one run: the price fields at
    ``QUALITY_PRICE_SHIFT``, and the stored non-key fields declaring ``shift=`` at theirs. What the
    writer keeps waiting, the pair checks judge and ``--report`` checks of held values."""
    shifts = {name: price_shift for name in item_type.price_fields()}
    columns = item_type.columns()
    for name, meta in item_type.fields.items():
        if meta.get("shift") is not None and name in columns and name not in item_type.key:
            shifts[name] = float(meta["shift"])
    return shifts


def declared_coverage(spider: Any, item_type: type) -> dict[str, float]:
    """Field -> expected coverage declared by the item type, then the spider (the spider wins).

    A ``coverage`` dict maps field names to the share of stored items that must have them."""
    declared: dict[str, float] = {}
    for owner in (item_type, spider):
        for field, ratio in (getattr(owner, "coverage", None) or {}).items():
            if field not in item_type.fields:
                continue  # a spider's expectation names the fields of the item types that have them
            declared[field] = float(ratio)
    return declared


def check_declared_coverage(spider: Any) -> None:
    """A spider's ``coverage`` must map field names to shares between 0 and 1."""
    coverage = getattr(spider, "coverage", None)
    if coverage is None:
        return
    if not isinstance(coverage, dict):
        raise ConfigError(f"QUALITY coverage of spider {spider.name!r}: expected a dict of field -> share")
    for field, ratio in coverage.items():
        try:
            ok = 0.0 <= float(ratio) <= 1.0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ConfigError(
                f"QUALITY coverage of spider {spider.name!r}: {field} expects {ratio!r}, not a share between 0 and 1"
            )
