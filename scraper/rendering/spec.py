"""What a spider asks of a rendered page, in a few declarative lines.

``render = True`` renders the page as it loads. A dict says more::

    render = {
        "wait_for": "ul.products li",     # an element, not the load event: content after a delay
        "click": "button.load-more",      # clicked until it is gone ("Load more")
        "scroll": True,                   # scrolled to the bottom until the page stops growing
        "retry_if": ".error-box",         # rendered again while this shows (then a dead letter)
    }

The spider's ``render`` attribute is the default of its requests; a request's ``render`` meta key
wins (``False``: fetched as is). Meta travels through the shared queue as JSON, so a spec is plain
data, checked when it is first used: a bad key fails naming itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import ConfigError

KEYS = ("wait_for", "click", "scroll", "retry_if")


@dataclass(frozen=True)
class RenderSpec:
    wait_for: str | None = None
    click: str | None = None
    scroll: bool = False
    retry_if: str | None = None

    def as_meta(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in KEYS}


PLAIN = RenderSpec()


def parse_spec(value: Any, where: str = "render") -> RenderSpec | None:
    """``True``/a dict -> a spec; ``False``/``None`` -> None (not rendered). Raises ConfigError
    naming *where* and the bad key."""
    if value is None or value is False:
        return None
    if value is True:
        return PLAIN
    if isinstance(value, RenderSpec):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected true or a dict of {', '.join(KEYS)}, got {value!r}")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
    for key in ("wait_for", "click", "retry_if"):
        if value.get(key) is not None and (not isinstance(value[key], str) or not value[key].strip()):
            raise ConfigError(f"{where}: {key} must be a CSS selector, got {value[key]!r}")
    if not isinstance(value.get("scroll", False), bool):
        raise ConfigError(f"{where}: scroll must be true or false, got {value['scroll']!r}")
    return RenderSpec(
        wait_for=value.get("wait_for"),
        click=value.get("click"),
        scroll=bool(value.get("scroll", False)),
        retry_if=value.get("retry_if"),
    )


def check_spider(spidercls: Any, settings: Any) -> None:
    """At start: the spider's ``render`` spec, and, when it renders, a browser to render with."""
    import os

    from .config import read_config

    spec = parse_spec(getattr(spidercls, "render", None), f"{spidercls.__name__}.render")
    if spec is None:
        return
    browser = read_config(settings).browser
    if not os.access(browser, os.X_OK):
        raise ConfigError(
            f"RENDER_BROWSER: {browser} is not an executable Chromium, and {spidercls.__name__} renders its "
            "pages (`make tools` installs Debian's chromium)"
        )
