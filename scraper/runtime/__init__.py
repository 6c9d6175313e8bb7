"""The process a crawl runs in: its logs and log formatter, stats collector, worker threads,
process lookups and the redaction of secrets."""
