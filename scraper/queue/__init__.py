"""The shared request queue: scrapy-redis' scheduler, a JSON serializer and a scalable dupefilter."""
