"""Where this project reads what Scrapy keeps private: one module per thing, so a change in
Scrapy is met in one place."""
