"""The ``RENDER_*`` settings, read and checked in one place (a bad one fails at start by name)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import ConfigError, get_float, get_int, get_text

# Playwright's names for what a page loads; a document is never blocked (it is the page).
RESOURCE_TYPES = frozenset(
    {
        "stylesheet",
        "image",
        "media",
        "font",
        "script",
        "texttrack",
        "xhr",
        "fetch",
        "eventsource",
        "manifest",
        "ping",
        "other",
    }
)


@dataclass(frozen=True)
class RenderConfig:
    browser: str
    max_pages: int
    context_pages: int
    page_timeout: float
    block: frozenset[str]
    crash_retries: int
    error_retries: int
    max_actions: int
    settle: float
    max_redirects: int


def read_config(settings: Any) -> RenderConfig:
    """Every ``RENDER_*`` setting, checked; raises ConfigError naming a bad one."""
    raw = settings.get("RENDER_BLOCK_RESOURCES", "image,font,media")
    items = raw if isinstance(raw, (list, tuple, set, frozenset)) else str(raw or "").split(",")
    block = frozenset(str(i).strip().lower() for i in items if str(i).strip()) - {"none"}
    unknown = sorted(block - RESOURCE_TYPES)
    if unknown:
        raise ConfigError(
            f"RENDER_BLOCK_RESOURCES: unknown resource type(s) {', '.join(unknown)} "
            f"(one of {', '.join(sorted(RESOURCE_TYPES))}; a document is never blocked)"
        )
    browser = get_text(settings, "RENDER_BROWSER")  # unset: Debian's path; set to nothing: refused
    if not browser:
        raise ConfigError("RENDER_BROWSER: empty (the path of a Chromium, e.g. /usr/bin/chromium)")
    return RenderConfig(
        browser=browser,
        max_pages=get_int(settings, "RENDER_MAX_PAGES"),
        context_pages=get_int(settings, "RENDER_CONTEXT_PAGES"),
        page_timeout=get_float(settings, "RENDER_PAGE_TIMEOUT"),
        block=block,
        crash_retries=get_int(settings, "RENDER_CRASH_RETRIES"),
        error_retries=get_int(settings, "RENDER_ERROR_RETRIES"),
        max_actions=get_int(settings, "RENDER_MAX_ACTIONS"),
        settle=get_float(settings, "RENDER_SETTLE_TIME"),
        max_redirects=get_int(settings, "RENDER_MAX_REDIRECTS"),
    )
