"""Playing a spider's declared actions on a page (see :mod:`.spec`).

Each action waits on the page itself, never for a fixed time: for an element (``wait_for``), for a
button to be clickable again or gone (``click``), for the page to grow after a scroll
(``scroll``, at most ``RENDER_SETTLE_TIME`` per step), and for the page's own requests to go
quiet between steps (the guard sees every one of them).
"""

from __future__ import annotations

from typing import Any

from .config import RenderConfig
from .guard import PageState
from .spec import RenderSpec

# A button is "ready" when enabled and shown, "gone" when absent or hidden; otherwise (disabled
# while the page loads what it asked for) the click waits.
_BUTTON = """sel => {
  const b = document.querySelector(sel);
  if (!b) return "gone";
  const style = getComputedStyle(b);
  if (style.display === "none" || style.visibility === "hidden") return "gone";
  if (b.disabled || b.getAttribute("aria-busy") === "true") return false;
  return "ready";
}"""
_SCROLL = "() => { const h = document.documentElement.scrollHeight; window.scrollTo(0, h); return h; }"
_GROWN = "h => document.documentElement.scrollHeight > h"
_QUIET = 0.05


async def play(page: Any, spec: RenderSpec, state: PageState, conf: RenderConfig) -> bool:
    """Run *spec* on *page*; True when the page shows its error (``retry_if``)."""
    if spec.wait_for:
        either = f"{spec.wait_for}, {spec.retry_if}" if spec.retry_if else spec.wait_for
        await page.wait_for_selector(either, state="attached")
        if await _shows(page, spec):
            return True
    actions = 0
    if spec.click:
        while actions < conf.max_actions:
            ready = await page.wait_for_function(_BUTTON, arg=spec.click)
            if await ready.json_value() == "gone" or await _shows(page, spec):
                break
            await page.click(spec.click)
            actions += 1
            await state.quiet(_QUIET)
    if spec.scroll:
        from playwright.async_api import TimeoutError as PlaywrightTimeout

        while actions < conf.max_actions:
            height = await page.evaluate(_SCROLL)
            actions += 1
            await state.quiet(_QUIET)
            try:
                await page.wait_for_function(_GROWN, arg=height, timeout=conf.settle * 1000)
            except PlaywrightTimeout:
                break
            if await _shows(page, spec):
                break
    return await _shows(page, spec)


async def _shows(page: Any, spec: RenderSpec) -> bool:
    return bool(spec.retry_if) and await page.query_selector(spec.retry_if) is not None
