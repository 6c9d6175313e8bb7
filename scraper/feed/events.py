"""One change event: a row of ``item_changes`` as every sink sends it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# The columns an event is read from, in the order :meth:`Event.from_row` takes them.
COLUMNS = "id, item_table, key, kind, reason, spider, run_id, at, changes"


@dataclass(frozen=True)
class Event:
    id: int
    item_table: str
    key: list[Any]
    kind: str  # insert | update | gone | back
    reason: str  # crawl | reprocess | revert | ...
    spider: str | None
    run_id: int | None
    at: datetime
    changes: dict[str, Any]

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Event:
        return cls(*row)

    @property
    def message_id(self) -> str:
        """The event's stable id: the row's id, the same at every delivery of it, to every sink
        (a consumer dedupes by it)."""
        return str(self.id)

    @property
    def key_text(self) -> str:
        """The item key as one string (JSON array), the same for every event of the item."""
        return json.dumps(self.key, ensure_ascii=False, separators=(",", ":"), default=str)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "table": self.item_table,
            "key": self.key,
            "kind": self.kind,
            "reason": self.reason,
            "spider": self.spider,
            "run_id": self.run_id,
            "at": self.at.isoformat(),
            "changes": self.changes,
        }

    def body(self) -> bytes:
        return json.dumps(self.as_dict(), ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8")
