"""Price checks that compare like with like: the same items' prices, run over run.

A run's median price per currency moves whenever the run stored a different part of the
catalogue (half the pages broken, a category added), though every price stored is right: the
medians are over different items. Each stored price change is in the history with its old and
new value, so the run's prices are compared pair by pair instead: among the items of a type
the run stored that existed before it, the share whose price moved by more than
``QUALITY_PRICE_SHIFT`` must stay under ``QUALITY_PRICE_JUMPS``. A parser that reads prices
1000x too small moves every pair; a sale moves a few.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..items.base import StoredItem
from . import coverage
from .checks import Check, _skip
from .settings import QualitySettings


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
            for field in item_type.price_fields():
                subject = f"{name}.{field}"
                if pairs < max(conf.min_items, 1):
                    out.append(
                        _skip(
                            "price_pairs",
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
                    {"table": item_type.table, "spider": spider, "run": run_id, "f": field, "shift": conf.price_shift},
                )
                jumps = cur.fetchone()[0]
                share = jumps / pairs
                out.append(
                    Check(
                        "price_pairs",
                        subject,
                        f"<= {conf.price_jumps:.0%}",
                        f"{share:.1%}",
                        share <= conf.price_jumps + 1e-9,
                        f"{jumps} of {pairs:.0f} prices seen before moved by more than {conf.price_shift:.0%}",
                    )
                )
    return out
