"""Processing apart from fetching (``PROCESSING=decoupled``), see docs/operations/decoupled.md.

Fetchers (``scrapy crawl``) download and archive, and hand each response to a Redis Stream
(:mod:`.handoff`), holding new downloads while it is full (:mod:`.backpressure`) and staying
open while it holds entries (:mod:`.keepalive`). Processors (``scrapy process``, :mod:`.scheduler`,
:mod:`.answer`) run the callbacks and the item pipeline over the stream's entries (:mod:`.entry`,
:mod:`.stream`) as a consumer group.
"""
