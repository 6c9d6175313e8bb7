"""The project's settings, declared once (:mod:`.registry`): ``scraper/settings.py``, the start-up
checks and the settings reference page all come from that one table."""
