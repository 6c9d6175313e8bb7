"""Price checks that compare like with like: the same items' prices, run over run.

A run's median price per currency moves whenever the run stored a different part of the
catalogue (half the pages broken, a category added), though every price stored is right: the
medians are over different items. Each stored price change is in the history with its old and
new value, so the run's prices are compared pair by pair instead: among the items of a type
the run stored that existed before it, the share whose price moved by more than
``QUALITY_PRICE_SHIFT`` must stay under ``QUALITY_PRICE_JUMPS``. A parser that reads prices
1000x too small moves every pair; a sale moves a few. A numeric field that declares a ``shift``
(``scrapy.Field(sql="numeric", shift=0.5)``) is checked the same way (``value_pairs``), with its
own shift.

A move beyond the shift in a run that judges itself is not in the history yet: it waits with the
run (``held_changes``, kind ``value``, see :class:`scraper.storage.upsert.Watch`) and is counted
from there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..items.base import StoredItem
from ..storage import held
from . import coverage
from .checks import Check, _skip
from .settings import QualitySettings, value_shifts


def price_checks(
    conn: Any,
    spider: str,
    run_id: int,
    item_types: Iterable[type[StoredItem]],
    current: dict[str, float],
    conf: QualitySettings,
) -> list[Check]:
    stored = coverage.item_counts(current)
    out: list[Check] = []
    with conn, conn.cursor() as cur:
        held.ensure(cur)
        for item_type in item_types:
            name = item_type.__name__
            if name not in stored:
                continue
            cur.execute(
                "SELECT count(*) FROM item_changes WHERE item_table = %s AND spider = %s AND run_id = %s "
                "AND kind = 'insert'",
                (item_type.table, spider, run_id),
            )
            pairs = stored[name] - cur.fetchone()[0]
            watched = value_shifts(item_type, conf.price_shift)
            for field, shift in watched.items():
                subject = f"{name}.{field}"
                check = "price_pairs" if field in item_type.price_fields() else "value_pairs"
                if pairs < max(conf.min_items, 1):
                    out.append(
                        _skip(
                            check,
                            subject,
                            f"skipped: {pairs:.0f} items seen before, fewer than QUALITY_MIN_ITEMS={conf.min_items}",
                        )
                    )
                    continue
                # A price that went from or to nothing is a coverage matter, not a jump.
                cur.execute(
                    """
                    SELECT count(*) FROM item_changes
                    WHERE item_table = %(table)s AND spider = %(spider)s AND run_id = %(run)s AND kind = 'update'
                        AND reason = 'crawl' AND jsonb_typeof(changes->%(f)s->0) = 'number'
                        AND jsonb_typeof(changes->%(f)s->1) = 'number'
                        AND abs((changes->%(f)s->>1)::numeric - (changes->%(f)s->>0)::numeric)
                            > %(shift)s * greatest(abs((changes->%(f)s->>0)::numeric), 0.01)
                    """,
                    {"table": item_type.table, "spider": spider, "run": run_id, "f": field, "shift": shift},
                )
                jumps = cur.fetchone()[0]
                # Waiting values that moved beyond the shift (changes on probation wait too, moved or not).
                cur.execute(
                    """
                    SELECT count(*) FROM held_changes
                    WHERE spider = %(spider)s AND run_id = %(run)s AND item_table = %(table)s AND kind = 'value'
                        AND jsonb_typeof(changes->%(f)s->0) IN ('number', 'string')
                        AND jsonb_typeof(changes->%(f)s->1) IN ('number', 'string')
                        AND (changes->%(f)s->>0) ~ '^-?[0-9]+([.][0-9]+)?([eE][-+]?[0-9]+)?$'
                        AND (changes->%(f)s->>1) ~ '^-?[0-9]+([.][0-9]+)?([eE][-+]?[0-9]+)?$'
                        AND abs((changes->%(f)s->>1)::numeric - (changes->%(f)s->>0)::numeric)
                            > %(shift)s * greatest(abs((changes->%(f)s->>0)::numeric), 0.01)
                    """,
                    {"table": item_type.table, "spider": spider, "run": run_id, "f": field, "shift": shift},
                )
                waiting = cur.fetchone()[0]
                jumps += waiting
                share = jumps / pairs
                what = "prices" if check == "price_pairs" else f"{field} values"
                out.append(
                    Check(
                        check,
                        subject,
                        f"<= {conf.price_jumps:.0%}",
                        f"{share:.1%}",
                        share <= conf.price_jumps + 1e-9,
                        f"{jumps} of {pairs:.0f} {what} seen before moved by more than {shift:.0%}"
                        + (f" ({waiting} waiting for this verdict)" if waiting else ""),
                    )
                )
    return out
