"""The change feed: every row of ``item_changes`` published once per sink, in commit order per
item key (see docs/guides/change-feed.md).

``item_changes`` is the outbox: it is written in the upsert's own transaction, so an event exists
exactly when its change is committed. The relay (:mod:`.relay`, ``scrapy feed run``) is its own
process and reads it by transaction visibility (:mod:`.position`), never by ``id > last``.
"""
