"""Recrawl only what changed: each page's validators and change history, and a revisit run that
fetches the pages that are due.

* :mod:`.schedule`: when a page is due (its own history, halved on change and grown without,
  between a minimum and a maximum; a sitemap's ``lastmod`` and ``changefreq`` as hints).
* :mod:`.store`: the ``pages`` table, one row per page identity and spider.
* :mod:`.recorder`: the extension that holds the spider's page states for the crawl, records
  each visit and writes them back.
* :mod:`.conditional`: the downloader middleware that sends ``If-None-Match`` /
  ``If-Modified-Since`` and turns a ``304`` into "the page's items are still there".
* :mod:`.due`: the spider middleware that records what each page yielded and, in a revisit run
  (``scrapy crawl SPIDER --due``), queues the due pages and drops the links to pages not due.
"""
