"""One spider per site. ``scrapy genspider -t product <name> <domain>`` starts a new one."""
