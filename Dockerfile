# One image for every crawl node: `scrapy crawl <spider>` or scrapyd, same code.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY requirements.txt .
# scrapyd for the nodes that run it (docker-compose.yml, profile "scrapyd"); the same pin as in
# requirements-dev.txt (tests/test_deploy.py checks that they agree).
RUN pip install --no-cache-dir -r requirements.txt scrapyd==1.6.0
COPY scrapy.cfg ./
COPY scrapyd.conf /etc/scrapyd/scrapyd.conf
COPY scraper ./scraper
# Bytecode made once here: with PYTHONDONTWRITEBYTECODE every process would compile the
# project's modules again at its start (~0.1 s of CPU per `scrapy` command).
RUN python -m compileall -q scraper
# uid 1000: docker-compose.yml gives the shared metrics-targets volume to this user.
RUN useradd --create-home --uid 1000 crawler \
 && mkdir -p /app/.data /var/lib/scrapyd/eggs /var/lib/scrapyd/dbs /var/log/scrapyd /var/lib/scraper/metrics-targets \
 && chown -R crawler /app/.data /var/lib/scrapyd /var/log/scrapyd /var/lib/scraper
USER crawler
CMD ["scrapy", "crawl", "demo"]
