# Two commands do all the set-up on a fresh machine (only Python 3.11+ needed):
#   make demo   crawl the bundled demo shop through the whole pipeline (embedded Redis + Postgres);
#               make demo API=1 fetches every page through the local scraping-API stand-in;
#               make demo BREAK=1 serves half the product pages in a new layout (data-quality drill);
#               make demo RENDER=1 crawls the shop's JavaScript-only section in a real browser
#   make test   install what the tests need and run them
#   make docs   build the documentation site into .site/ (mkdocs, strict)
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | cksum | cut -d' ' -f1)
PRODUCTS ?= 500
TARGET  ?= default
# Three pytest workers on two cores: most tests wait on real processes (crawls, servers), not
# the CPU. The whole suite on this 2-core machine, one run each: 2 workers 20:55, 3 workers 15:16.
TEST_WORKERS ?= 3

.PHONY: install tools demo demo-site test test-fast check docs bench clean deploy

$(STAMP): requirements.txt requirements-dev.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/scrapy demo --products $(PRODUCTS) $(if $(API),--api) $(if $(BREAK),--break-layout) $(if $(RENDER),--render)

demo-site: $(STAMP)
	$(BIN)/python -m scraper.demo_site --port 8765 --products $(PRODUCTS)

# System tools the tests drive, from Debian's archive (installed here, never inside a test):
# faketime (a worker with a skewed clock), prometheus/promtool (scrapes, alert-rule tests),
# redis-server/redis-cli (servers a test injects faults into, Redis Cluster), docker-compose
# (the compose file's validation), chromium (the browser that renders pages; Playwright's own
# browser download is not used).
TOOLS = faketime:faketime promtool:prometheus prometheus:prometheus redis-server:redis-server chromium:chromium \
        redis-cli:redis-tools docker-compose:docker-compose
tools:
	@missing=""; for pair in $(TOOLS); do command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  { apt-get install -y -qq --no-install-recommends $$missing >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends $$missing >/dev/null 2>&1; }; } || \
	  { echo "make tools: could not install$$missing (apt-get install$$missing, as root)" >&2; exit 1; }; \
	fi

# The project's bytecode is written first: with PYTHONDONTWRITEBYTECODE set (as on this
# machine), every `scrapy` process the tests start would compile ~150 of its modules again,
# ~0.1 s of CPU each time (compileall writes whatever that variable says; a changed file's
# stale bytecode is ignored by its timestamp).
test: $(STAMP) tools
	$(BIN)/python -m compileall -q -j 0 scraper tests bench >/dev/null
	$(BIN)/python -m pytest $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

# Lint, format and the import contracts (no cycles; commands over node over runs over queue;
# crawl code free of the development tools). CI runs it before the tests.
check: $(STAMP)
	$(BIN)/ruff check scraper tests bench
	$(BIN)/ruff format --check scraper tests bench
	PYTHONPATH=. $(BIN)/lint-imports

# The documentation site (mkdocs.yml, docs/): strict, so a broken link or a page missing from the nav fails.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir .site

# The tests that start no process (no crawl, command or server of their own): under a minute.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not process" -q $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS))

bench: $(STAMP)
	$(BIN)/python bench/run.py

clean:
	rm -rf .data .pytest_cache

# Build the project's egg and upload it to scrapyd: `make deploy TARGET=name`, a [deploy:name]
# section of scrapy.cfg (default: SCRAPYD_URL). Credentials come from the environment only.
deploy: $(STAMP)
	@test -n "$$SCRAPYD_USERNAME" && test -n "$$SCRAPYD_PASSWORD" || \
	  { echo "deploy: set SCRAPYD_USERNAME and SCRAPYD_PASSWORD (scrapyd runs with authentication on)" >&2; exit 2; }
	@test "$(TARGET)" != default || test -n "$$SCRAPYD_URL" || \
	  { echo "deploy: set SCRAPYD_URL, or name a target of scrapy.cfg: make deploy TARGET=local" >&2; exit 2; }
	$(BIN)/scrapyd-deploy $(TARGET)
