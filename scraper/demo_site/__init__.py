"""A bundled, deterministic demo shop for offline crawling tests and benchmarks."""

from .catalog import Catalog
from .ref_links import RefLinks
from .server import DemoSite

__all__ = ["Catalog", "DemoSite", "RefLinks"]
