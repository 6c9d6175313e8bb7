"""Events a sink gave up on (a webhook after its last try), kept in Postgres with the reason.

Written in the same transaction as the position that moves past them: an event is either
still ahead of the relay or here (or delivered), never nowhere. The reason is the sink's own
text (an HTTP status, a connection error), never a URL with its secret; ``scrapy feed verify``
counts them as not delivered.
"""

from __future__ import annotations

import json
from typing import Any

from .events import Event

TABLE = "change_feed_dead_letters"
DDL = """
CREATE TABLE IF NOT EXISTS change_feed_dead_letters (
    sink        text NOT NULL,
    event_id    bigint NOT NULL,
    reason      text NOT NULL,
    event       jsonb NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sink, event_id)
);
"""


def ensure(cur: Any) -> None:
    cur.execute(DDL)


def record(cur: Any, sink: str, dead: list[tuple[Event, str]]) -> None:
    cur.execute(
        "INSERT INTO change_feed_dead_letters (sink, event_id, reason, event)"
        " SELECT %s, d.id, d.reason, d.event FROM jsonb_to_recordset(%s::jsonb) AS d(id bigint, reason text, event jsonb)"
        " ON CONFLICT (sink, event_id) DO UPDATE SET reason = EXCLUDED.reason, at = now()",
        (sink, json.dumps([{"id": e.id, "reason": r, "event": e.as_dict()} for e, r in dead], default=str)),
    )
