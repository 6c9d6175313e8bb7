"""The verdict on the changes a run kept waiting: written where the field's checks passed, held
where they failed.

A run that judges itself keeps a stored value that moves implausibly (a price beyond its shift)
or goes empty out of its row until the run is over (:class:`scraper.storage.upsert.Watch`), so a
reader of the table or the history never sees a bundle price or a blank that the run's own
checks then call broken. The last node out, having checked the run, writes the waiting changes
of every field no failed check names (history reason ``crawl``, as if they had not waited) and
leaves the others held with the run (``scrapy runs SPIDER --report RUN``, then ``--apply`` or
``--discard``). The count left held is a failed check of its own (``held_values``), so the run
is degraded and says how many values it kept back, and why.
"""

from __future__ import annotations

import logging
from typing import Any

from ..items import stored_item_types
from ..storage import held
from .checks import Check

logger = logging.getLogger(__name__)

# The checks whose failure names a field ("Type.field") whose waiting changes stay held.
_FIELD_CHECKS = ("coverage", "price_pairs", "value_pairs", "guard")


def failed_fields(checks: list[Check]) -> set[str]:
    out = set()
    types = stored_item_types()
    for c in checks:
        if c.passed is False and c.check in _FIELD_CHECKS and c.subject:
            # A values break is recorded as "values/Type.field"; a rejects break names a field of
            # any type ("rejects/price"): what the run read of it elsewhere (a repair's reading
            # with a defaulted currency, say) is as much in doubt, in every type that has it.
            if c.subject.startswith("rejects/"):
                name = c.subject.removeprefix("rejects/")
                out.update(f"{t.__name__}.{name}" for t in types if name in t.fields)
                continue
            subject = c.subject.removeprefix("values/")
            if "/" not in subject and "." in subject:
                out.add(subject)
    # A price read wrong brings its currency with it: the two stay held together.
    for item_type in types:
        for price, currency in item_type.price_fields().items():
            if f"{item_type.__name__}.{price}" in out:
                out.add(f"{item_type.__name__}.{currency}")
    return out


def settle_waiting(conn: Any, spider: str, run_id: int, checks: list[Check]) -> list[Check]:
    """Write or keep run *run_id*'s waiting changes by *checks*' verdict; a failed check per
    field whose values stay held."""
    done = held.settle(conn, spider, run_id, stored_item_types(), failed_fields(checks))
    if done.applied:
        logger.info("Run %d of %s: %d waiting change(s) judged sound and written", run_id, spider, done.applied)
    return [
        Check(
            "held_values",
            field,
            "0",
            f"{count}",
            False,
            f"values kept out of the table: their check failed (scrapy runs {spider} --report {run_id})",
        )
        for field, count in sorted((done.kept or {}).items())
    ]
