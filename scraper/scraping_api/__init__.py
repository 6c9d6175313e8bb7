"""Fetching through a scraping API (AlterLab first; ScrapingBee and Zyte API too).

* :mod:`.middleware` - the downloader middleware (``SCRAPING_API_*`` settings);
* :mod:`.providers` - each API's wire format behind one small interface;
* :mod:`.routing` - per-domain ``always`` / ``never`` / ``on_block`` and block detection;
* :mod:`.budget` - the credit budget, with in-flight reservations;
* :mod:`.addon` - registers the key for log redaction and checks the settings at start;
* :mod:`.standin` - a local stand-in for the AlterLab API (``python -m scraper.scraping_api.standin``).
"""
