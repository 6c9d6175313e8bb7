"""Availability as schema.org's ItemAvailability term (``InStock``, ``OutOfStock``, ...).

Pages write the member's URL (``https://schema.org/InStock``, ``http://schema.org/InStock``), its
bare term, or a label ("In stock", "Sold out", "Auf Lager"). Terms and URLs are read whatever
their case; labels in a few common languages are mapped; any other text is kept as it is
(cleaned), since an unknown label is still worth storing and reading later.
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = ["TERMS", "normalise_availability"]

# schema.org ItemAvailability's members.
TERMS = (
    "BackOrder",
    "Discontinued",
    "InStock",
    "InStoreOnly",
    "LimitedAvailability",
    "MadeToOrder",
    "OnlineOnly",
    "OutOfStock",
    "PreOrder",
    "PreSale",
    "Reserved",
    "SoldOut",
)
_BY_KEY = {term.casefold(): term for term in TERMS}
_URL = re.compile(r"^https?://(?:www\.)?schema\.org/", re.IGNORECASE)
_LABELS = {
    **dict.fromkeys(
        [
            "in stock",
            "available",
            "in stock now",
            "auf lager",
            "lieferbar",
            "verfügbar",
            "en stock",
            "disponible",
            "en existencia",
            "disponibile",
            "op voorraad",
            "na stanie",
            "em estoque",
            "skladem",
            "i lager",
            "在庫あり",
            "有货",
            "в наличии",
        ],
        "InStock",
    ),
    **dict.fromkeys(
        [
            "out of stock",
            "unavailable",
            "not available",
            "currently unavailable",
            "nicht auf lager",
            "nicht lieferbar",
            "ausverkauft",
            "rupture de stock",
            "épuisé",
            "agotado",
            "esaurito",
            "niet op voorraad",
            "brak w magazynie",
            "esgotado",
            "vyprodáno",
            "slut i lager",
            "在庫切れ",
            "缺货",
            "нет в наличии",
        ],
        "OutOfStock",
    ),
    **dict.fromkeys(["sold out"], "SoldOut"),
    **dict.fromkeys(["pre-order", "preorder", "pre order", "vorbestellbar", "précommande"], "PreOrder"),
    **dict.fromkeys(["backorder", "back order", "back-order", "on backorder"], "BackOrder"),
    **dict.fromkeys(["discontinued"], "Discontinued"),
    **dict.fromkeys(["limited availability", "only a few left", "few left"], "LimitedAvailability"),
}


@lru_cache(maxsize=1024)  # a site writes a handful of labels, on every item
def normalise_availability(text: str | None) -> str | None:
    """The schema.org term *text* names, or *text* itself when it names none."""
    if not text:
        return text
    key = _URL.sub("", text.strip()).strip().rstrip("/").rstrip(".!").strip()
    folded = " ".join(key.casefold().split())
    return _BY_KEY.get(folded.replace(" ", "")) or _LABELS.get(folded) or text
