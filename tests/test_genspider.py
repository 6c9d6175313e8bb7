"""`scrapy genspider -t product` writes a working one-file spider on our base class."""

from __future__ import annotations

import shutil

from support.crawls import ROOT, crawl_env, run_scrapy


def test_product_template_makes_a_spider_the_project_can_run(services, tmp_path) -> None:
    project = tmp_path / "project"
    shutil.copytree(ROOT / "scraper", project / "scraper", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "scrapy.cfg", project)
    env = crawl_env(services, PYTHONPATH=str(project))
    result = run_scrapy(env, "genspider", "-l", cwd=project)
    assert "product" in result.stdout and "basic" in result.stdout
    result = run_scrapy(env, "genspider", "-t", "product", "shop", "shop.example", cwd=project)
    assert result.returncode == 0, result.stderr
    source = (project / "scraper" / "spiders" / "shop.py").read_text()
    assert "class ShopSpider(CatalogSpider):" in source and 'start_urls = ["https://shop.example"]' in source
    listed = run_scrapy(env, "list", cwd=project)
    assert "shop" in listed.stdout.split()
