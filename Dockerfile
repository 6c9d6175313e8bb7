# One image for every crawl node: `scrapy crawl <spider>` or scrapyd, same code.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY scrapy.cfg scrapyd.conf ./
COPY scraper ./scraper
RUN useradd --create-home crawler && mkdir -p /app/.data && chown crawler /app/.data
USER crawler
CMD ["scrapy", "crawl", "demo"]
