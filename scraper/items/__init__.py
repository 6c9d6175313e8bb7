"""Item types that carry their own storage contract (see :mod:`.base`), and the bundled ones."""

from .base import StoredItem, registered_item_types
from .product import ProductItem

__all__ = ["ProductItem", "StoredItem", "stored_item_types"]


def stored_item_types() -> list[type[StoredItem]]:
    """Every item type with a table (the bundled ones, registered by importing them, and any a
    project module defined), for migrations."""
    return registered_item_types()
