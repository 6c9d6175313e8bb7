"""Runs: every ``scrapy crawl`` starts, resumes or joins one run of its spider.

The run's state lives in Redis (:mod:`.state`), its record in Postgres (:mod:`.record`), and
the extension that keeps the record and the figures is :mod:`.recorder`.
"""
