"""Item types that carry their own storage contract (see :mod:`.base`), and the bundled ones.

An item type registers itself when its class is defined, so the tables a migration makes are
those of the modules imported: :func:`stored_item_types` imports every module of this package
first, so that a type declared next to ``product.py`` needs no import anywhere to get its table.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys

from .base import StoredItem, registered_item_types
from .product import ProductItem

__all__ = ["ProductItem", "StoredItem", "item_module_errors", "stored_item_types"]

logger = logging.getLogger(__name__)

_failures: list[str] | None = None
_reported = False


def item_module_errors() -> list[str]:
    """Import every module of this package (once per process); each one that cannot be imported,
    named with its error. Such a module's item types get no table from a migration."""
    global _failures
    if _failures is None:
        failures: dict[str, str] = {}

        def failed(name: str) -> None:
            # Called inside the walk's own except clause (a subpackage it imports to look inside).
            error = sys.exc_info()[1]
            failures.setdefault(name, f"{name} cannot be imported ({type(error).__name__}: {error})")

        for module in pkgutil.walk_packages(__path__, prefix=f"{__name__}.", onerror=failed):
            if module.name in failures:
                continue
            try:
                importlib.import_module(module.name)
            except Exception:
                failed(module.name)
        _failures = list(failures.values())
    return list(_failures)


def stored_item_types() -> list[type[StoredItem]]:
    """Every item type with a table: those of every module of this package (see
    :func:`item_module_errors` for one that cannot be imported), and any other module defined
    so far (a spider's), for migrations. A module that cannot be imported is logged, once."""
    global _reported
    failures = item_module_errors()
    if not _reported:
        _reported = True
        for failure in failures:
            logger.error("%s: its item types get no table", failure)
    return registered_item_types()
