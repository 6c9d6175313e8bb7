"""Items that carry their own storage contract.

An item type declares, on its Scrapy ``Field``s, everything the pipelines need:

* ``sql``: the Postgres column type (fields without it are not stored);
* ``clean``: which cleaner applies (``text``, ``price``, ``date``, ``url``);
* ``required``, ``type``, ``max_length``, ``pattern``, ``minimum``: the validation schema;
* ``join``: a field read with ``getall()`` stored as one text, its parts joined with a space
  (``True``) or with the separator given (``join="; "``);
* ``type=list``: a field whose parts are kept apart, each cleaned with the field's cleaner,
  stored in an array or JSON column (``sql="text[]"``, ``"jsonb"``);

and, on the class, ``table`` and ``key`` (the natural key, the columns that identify one entity).
The store pipeline creates and migrates the table from this; nothing is declared twice.
"""

from __future__ import annotations

from typing import Any, ClassVar

import scrapy

_registry: dict[str, type[StoredItem]] = {}


class StoredItem(scrapy.Item):
    table: ClassVar[str] = ""
    key: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Scrapy's ItemMeta builds a hidden "x_" twin of each Item class first, without its
        # collected ``fields`` and outside this class's hierarchy (so no zero-argument super()).
        if "fields" not in cls.__dict__ or not cls.table:
            return
        missing = [name for name in cls.key if name not in cls.fields]
        if not cls.key or missing:
            raise TypeError(f"{cls.__name__}: key {cls.key!r} must name declared fields (missing: {missing})")
        unstored = [name for name in cls.key if not cls.fields[name].get("sql")]
        if unstored:
            raise TypeError(f"{cls.__name__}: key fields {unstored} need an sql type")
        for name, meta in cls.fields.items():
            problem = _field_problem(meta)
            if problem:
                raise TypeError(f"{cls.__name__}.{name}: {problem}")
        _registry[cls.table] = cls

    @classmethod
    def columns(cls) -> dict[str, str]:
        """Stored field name -> SQL type, in declaration order (one dict per type: do not change it)."""
        found = cls.__dict__.get("_columns")
        if found is None:
            found = {name: meta["sql"] for name, meta in cls.fields.items() if meta.get("sql")}
            cls._columns = found
        return found

    @classmethod
    def price_fields(cls) -> dict[str, str]:
        """Price field name -> the field its currency goes to (``currency_field``, default
        ``currency``), for the fields cleaned as prices (one dict per type: do not change it)."""
        found = cls.__dict__.get("_price_fields")
        if found is None:
            found = {
                name: meta.get("currency_field", "currency")
                for name, meta in cls.fields.items()
                if meta.get("clean") == "price"
            }
            cls._price_fields = found
        return found

    # Mapping's own ``in`` and ``get`` go through __getitem__ and a raised KeyError; every
    # pipeline reads each field of each item this way, so they read the values directly.
    def __contains__(self, key: object) -> bool:
        return key in self._values

    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)


# Cleaners that read one part as they read one value; a price fills its currency field and an
# unreadable optional date is no problem, neither of which has a meaning per part.
LIST_CLEANERS = (None, "text", "url", "availability")


def _field_problem(meta: dict[str, Any]) -> str | None:
    """What makes a field's declaration one the pipelines would store wrongly, or None."""
    join, many, sql_type = meta.get("join"), meta.get("type") is list, str(meta.get("sql") or "")
    if join not in (None, False, True) and not (isinstance(join, str) and join):
        return f"join must be True (a space) or the separator, a non-empty string; got {join!r}"
    if join and meta.get("clean") != "text":
        return 'join needs clean="text": the parts are joined into one text'
    if many and join:
        return "type=list keeps the parts apart and join joins them: declare one of the two"
    if many and meta.get("clean") not in LIST_CLEANERS:
        return f"type=list cleans each part; clean={meta.get('clean')!r} cannot (use text, url or availability)"
    base = sql_type.strip().lower()
    if many and sql_type and not (base.endswith("[]") or base in ("json", "jsonb")):
        return f'type=list needs an array or JSON column (sql="text[]" or "jsonb"), not {sql_type!r}'
    return None


def registered_item_types() -> list[type[StoredItem]]:
    """Every item type with a table defined so far (see :func:`scraper.items.stored_item_types`)."""
    return list(_registry.values())
