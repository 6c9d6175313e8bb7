from .base import StoredItem, stored_item_types
from .product import ProductItem

__all__ = ["ProductItem", "StoredItem", "stored_item_types"]
