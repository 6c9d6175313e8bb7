"""Packaging for ``scrapyd-deploy``: the egg that scrapyd runs.

``scrapyd-deploy`` (``make deploy TARGET=name``) builds an egg from this file and uploads it.
The ``scrapy`` entry point tells scrapyd which settings module the jobs use. Dependencies are
not bundled: a scrapyd node installs ``requirements.txt`` itself (the Dockerfile does).
"""

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# Development tools (`make demo`, the tests): the bundled demo shop and the scraping-API stand-in
# are not what a scrapyd node runs, and stay out of the egg.
DEV_PACKAGES = ["scraper.demo_site", "scraper.demo_site.*"]
DEV_MODULES = {("scraper.scraping_api", "standin")}


class BuildWithoutDevTools(build_py):
    def find_package_modules(self, package, package_dir):
        return [m for m in super().find_package_modules(package, package_dir) if (m[0], m[1]) not in DEV_MODULES]


setup(
    name="scraper",
    version="1.0",
    python_requires=">=3.11",
    packages=find_packages(include=["scraper", "scraper.*"], exclude=DEV_PACKAGES),
    cmdclass={"build_py": BuildWithoutDevTools},
    # The genspider templates and the currency index are not Python modules; without this the
    # egg would lack them.
    package_data={"scraper": ["templates/*/*.tmpl", "cleaning/*.json"]},
    entry_points={"scrapy": ["settings = scraper.settings"]},
)
