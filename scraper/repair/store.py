"""The ``repairs`` table: each repair learnt, or refused, with its evidence and its state.

One row per (spider, item type, field, run): the nodes of a run that all saw the break may all
learn; the first verified repair written wins and every node applies that one (a refusal is
replaced by a later try, a repair never). States:

* ``active``: applied to every page of the spider's item type, in this run and the next ones;
* ``pending``: verified, waiting for ``scrapy repairs SPIDER --accept ID`` (``REPAIR_APPLY=review``);
* ``refused``: nothing could be verified (``reason`` says why): the field stays held;
* ``rejected`` / ``reverted``: undone by an operator (``--reject``, ``--revert``);
* ``superseded``: a later repair of the same field took its place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

DDL = """
CREATE TABLE IF NOT EXISTS repairs (
    id              bigserial PRIMARY KEY,
    spider          text NOT NULL,
    item_type       text NOT NULL,
    field           text NOT NULL,
    run_id          bigint NOT NULL DEFAULT 0,
    status          text NOT NULL,
    trigger         text NOT NULL DEFAULT '',
    old_selector    text,
    rules           jsonb NOT NULL DEFAULT '[]'::jsonb,
    evidence        integer NOT NULL DEFAULT 0,
    distinct_values integer NOT NULL DEFAULT 0,
    contradictions  integer NOT NULL DEFAULT 0,
    validation      jsonb NOT NULL DEFAULT '{}'::jsonb,
    reason          text,
    node            text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    decided_at      timestamptz,
    UNIQUE (spider, item_type, field, run_id)
);
"""

LIVE = ("active", "pending")
STATUSES = ("active", "pending", "refused", "rejected", "reverted", "superseded")


@dataclass
class RepairRow:
    id: int
    spider: str
    item_type: str
    field: str
    run_id: int
    status: str
    trigger: str
    old_selector: str | None
    rules: list[str]
    evidence: int
    distinct_values: int
    contradictions: int
    validation: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    node: str | None = None
    created_at: datetime | None = None
    decided_at: datetime | None = None

    @property
    def name(self) -> str:
        return f"{self.item_type}.{self.field}"


_COLUMNS = (
    "id, spider, item_type, field, run_id, status, trigger, old_selector, rules, evidence, distinct_values, "
    "contradictions, validation, reason, node, created_at, decided_at"
)


def ensure(cur: Any) -> None:
    cur.execute(DDL)


def save(cur: Any, row: RepairRow) -> RepairRow:
    """Record *row* (its ``id`` is ignored) unless the run already has a repair of the field, and
    return the one that stands: a later try replaces a refusal (its reason is the latest),
    nothing replaces a repair."""
    cur.execute(
        "INSERT INTO repairs (spider, item_type, field, run_id, status, trigger, old_selector, rules, evidence,"
        " distinct_values, contradictions, validation, reason, node)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s::jsonb, %s, %s)"
        " ON CONFLICT (spider, item_type, field, run_id) DO UPDATE SET"
        " status = EXCLUDED.status, trigger = EXCLUDED.trigger, old_selector = EXCLUDED.old_selector,"
        " rules = EXCLUDED.rules, evidence = EXCLUDED.evidence, distinct_values = EXCLUDED.distinct_values,"
        " contradictions = EXCLUDED.contradictions, validation = EXCLUDED.validation, reason = EXCLUDED.reason,"
        " node = EXCLUDED.node, created_at = now()"
        " WHERE repairs.status = 'refused'",
        (
            row.spider,
            row.item_type,
            row.field,
            row.run_id,
            row.status,
            row.trigger,
            row.old_selector,
            json.dumps(row.rules),
            row.evidence,
            row.distinct_values,
            row.contradictions,
            json.dumps(row.validation),
            row.reason,
            row.node,
        ),
    )
    cur.execute(
        f"SELECT {_COLUMNS} FROM repairs WHERE spider = %s AND item_type = %s AND field = %s AND run_id = %s",
        (row.spider, row.item_type, row.field, row.run_id),
    )
    stood = _row(cur.fetchone())
    if stood.status == "active":
        # Earlier repairs of the field give way to the newest.
        cur.execute(
            "UPDATE repairs SET status = 'superseded', decided_at = now() WHERE spider = %s AND item_type = %s"
            " AND field = %s AND status IN ('active', 'pending') AND id <> %s",
            (row.spider, row.item_type, row.field, stood.id),
        )
    return stood


def active(cur: Any, spider: str) -> list[RepairRow]:
    """The spider's repairs in force: the newest active one per item type and field."""
    cur.execute(
        f"SELECT DISTINCT ON (item_type, field) {_COLUMNS} FROM repairs WHERE spider = %s AND status = 'active'"
        " ORDER BY item_type, field, id DESC",
        (spider,),
    )
    return [_row(r) for r in cur.fetchall()]


def listed(cur: Any, spider: str, run_id: int | None = None) -> list[RepairRow]:
    if run_id is None:
        cur.execute(f"SELECT {_COLUMNS} FROM repairs WHERE spider = %s ORDER BY id", (spider,))
    else:
        cur.execute(f"SELECT {_COLUMNS} FROM repairs WHERE spider = %s AND run_id = %s ORDER BY id", (spider, run_id))
    return [_row(r) for r in cur.fetchall()]


def get(cur: Any, repair_id: int) -> RepairRow | None:
    cur.execute(f"SELECT {_COLUMNS} FROM repairs WHERE id = %s", (repair_id,))
    found = cur.fetchone()
    return _row(found) if found else None


def decide(cur: Any, repair_id: int, status: str) -> None:
    cur.execute("UPDATE repairs SET status = %s, decided_at = now() WHERE id = %s", (status, repair_id))
    if status == "active":
        row = get(cur, repair_id)
        if row is not None:
            cur.execute(
                "UPDATE repairs SET status = 'superseded', decided_at = now() WHERE spider = %s AND item_type = %s"
                " AND field = %s AND status = 'active' AND id <> %s",
                (row.spider, row.item_type, row.field, repair_id),
            )


def undone_with(cur: Any, row: RepairRow) -> RepairRow | None:
    """A repair of the same field with the same rules that an operator rejected or reverted."""
    cur.execute(
        f"SELECT {_COLUMNS} FROM repairs WHERE spider = %s AND item_type = %s AND field = %s"
        " AND status IN ('rejected', 'reverted') AND rules = %s::jsonb ORDER BY id DESC LIMIT 1",
        (row.spider, row.item_type, row.field, json.dumps(row.rules)),
    )
    found = cur.fetchone()
    return _row(found) if found else None


def _row(found: Any) -> RepairRow:
    (rid, spider, item_type, fld, run_id, status, trigger, old, rules, evidence, distinct, contra, valid, reason,
     node, created, decided) = found  # fmt: skip
    return RepairRow(
        int(rid),
        spider,
        item_type,
        fld,
        int(run_id),
        status,
        trigger,
        old,
        list(rules or []),
        int(evidence),
        int(distinct),
        int(contra),
        dict(valid or {}),
        reason,
        node,
        created,
        decided,
    )
