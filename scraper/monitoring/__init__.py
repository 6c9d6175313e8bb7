"""Prometheus metrics for every crawl process: a collector over the crawl's state and an exporter."""
