"""Rendering pages in a real browser (Playwright driving Chromium), inside the fetch boundary.

A request is rendered when its ``render`` meta key (or its spider's ``render`` attribute) says so:
:mod:`.middleware` marks it, :mod:`.handler` fetches the page as any page and hands its body to
the browser, :mod:`.guard` checks every request the page then makes, :mod:`.browser` keeps the
browser bounded, and :mod:`.actions` plays what the spider declared (wait, click, scroll, retry).
Nothing here imports Playwright until a page is rendered.
"""

#: meta key (and spider attribute) asking for a rendered page: True, or a dict of actions.
RENDER_META = "render"
#: the flag of a response the browser rendered (the archive marks its record with it).
RENDERED_FLAG = "rendered"
