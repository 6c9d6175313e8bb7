"""A production Scrapy project: shared Redis scheduler, cleaning pipelines, Postgres upserts."""
