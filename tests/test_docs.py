"""The documentation site: builds strictly, covers every page, and the README stays short.

No crawl processes: mkdocs only reads docs/ and mkdocs.yml.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MKDOCS = Path(sys.executable).parent / "mkdocs"


def _nav_pages(entries: object) -> set[str]:
    """Every page named anywhere in mkdocs.yml's nav."""
    pages: set[str] = set()
    if isinstance(entries, str):
        pages.add(entries)
    elif isinstance(entries, list):
        for entry in entries:
            pages |= _nav_pages(entry)
    elif isinstance(entries, dict):
        for value in entries.values():
            pages |= _nav_pages(value)
    return pages


def test_mkdocs_build_is_strict_and_clean(tmp_path: Path) -> None:
    assert MKDOCS.exists(), f"{MKDOCS} missing: make install (requirements-dev.txt has mkdocs)"
    result = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").exists()


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines: move the detail into docs/"


def test_index_opens_with_a_spider() -> None:
    head = "\n".join((DOCS / "index.md").read_text(encoding="utf-8").splitlines()[:40])
    assert "```python" in head
    assert re.search(r"^from scraper\.", head, re.M), "the example needs its imports"
    assert re.search(r"^class \w+\(\w*Spider\):", head, re.M)
    assert "def parse_product" in head or "def parse" in head
    assert "yield " in head


def test_every_page_is_in_the_nav() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    assert config.get("strict") is True
    assert config.get("docs_dir", "docs") == "docs"
    nav = _nav_pages(config["nav"])
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    assert pages - nav == set(), f"pages missing from mkdocs.yml's nav: {sorted(pages - nav)}"
    assert nav - pages == set(), f"nav entries without a page: {sorted(nav - pages)}"


def test_the_quickstart_says_what_a_shared_redis_needs_in_the_codes_own_words() -> None:
    """What happens without SCHEDULER_SECRET or FETCH_ALLOW_NETWORKS, quoted as the code says it."""
    page = " ".join((DOCS / "quickstart.md").read_text(encoding="utf-8").split())
    for quoted, source in (
        ("SCHEDULER_SECRET: required with a shared Redis (REDIS_URL), the same on every node", "queue/signing.py"),
        ("Not fetched: ", "middlewares/fetch_boundary.py"),
        (" is a non-public address ", "middlewares/fetch_boundary.py"),
        ("forbidden_address", "middlewares/fetch_boundary.py"),
        ("No page was fetched", "extensions/summary.py"),
        (" requests refused by the fetch boundary ", "extensions/summary.py"),
        ("FETCH_ALLOW_NETWORKS=127.0.0.0/8", "extensions/summary.py"),
    ):
        assert quoted in page, quoted
        assert quoted in (ROOT / "scraper" / source).read_text(encoding="utf-8"), (quoted, source)
