"""Packaging for ``scrapyd-deploy``: the egg that scrapyd runs.

``scrapyd-deploy`` (``make deploy TARGET=name``) builds an egg from this file and uploads it.
The ``scrapy`` entry point tells scrapyd which settings module the jobs use. Dependencies are
not bundled: a scrapyd node installs ``requirements.txt`` itself (the Dockerfile does).
"""

from setuptools import find_packages, setup

setup(
    name="scraper",
    version="1.0",
    python_requires=">=3.11",
    packages=find_packages(include=["scraper", "scraper.*"]),
    # The genspider templates and the currency index are not Python modules; without this the
    # egg would lack them.
    package_data={"scraper": ["templates/*/*.tmpl", "cleaning/*.json"]},
    entry_points={"scrapy": ["settings = scraper.settings"]},
)
