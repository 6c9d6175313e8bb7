"""Field cleaning helpers used by the item "clean" pipeline."""

from scraper.cleaning.dates import parse_date, read_date
from scraper.cleaning.price import parse_price, read_price
from scraper.cleaning.text import clean_text
from scraper.cleaning.urls import canonical_url, url_domain

__all__ = ["canonical_url", "clean_text", "parse_date", "parse_price", "read_date", "read_price", "url_domain"]
