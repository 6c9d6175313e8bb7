"""The raw archive: every response the spiders see, as WARC records, indexed in Postgres."""
