# Two commands do all the set-up on a fresh machine (only Python 3.11+ needed):
#   make demo   crawl the bundled demo shop through the whole pipeline (embedded Redis + Postgres)
#   make test   install what the tests need and run them
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | cksum | cut -d' ' -f1)
PRODUCTS ?= 500

.PHONY: install demo demo-site test bench clean

$(STAMP): requirements.txt requirements-dev.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/scrapy demo --products $(PRODUCTS)

demo-site: $(STAMP)
	$(BIN)/python -m scraper.demo_site --port 8765 --products $(PRODUCTS)

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/run.py

clean:
	rm -rf .data .pytest_cache
