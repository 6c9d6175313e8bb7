"""Work done in the reactor's thread pool whose result comes back in one pass of the loop.

Twisted's ``deferToThread`` hands a result back with ``callFromThread``, which on the asyncio
reactor is two passes of the event loop: ``call_soon_threadsafe`` runs a function that only
schedules a ``callLater(0)``, and that timer runs at the pass after. On a busy crawl one pass
runs every page callback that became ready meanwhile, so the result of a database commit or a
pipelined Redis batch waited ~15 ms for its Deferred to fire (measured on the demo shop at
~350 pages/s: the writer's batch took 9 ms in its thread and 25 ms as the reactor saw it).
Items wait on both, and their pages' leases wait on the items. Here the Deferred fires at the
loop's next pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer, threads
from twisted.python.failure import Failure


def defer_to_thread(fn: Callable[..., Any], *args: Any) -> defer.Deferred:
    """``fn(*args)`` in the reactor's thread pool; the Deferred fires on the reactor thread."""
    from twisted.internet import reactor

    loop = getattr(reactor, "_asyncioEventloop", None)
    if loop is None:  # another reactor: its own way back
        return threads.deferToThread(fn, *args)
    d: defer.Deferred = defer.Deferred()

    def work() -> None:
        try:
            result = fn(*args)
        except BaseException:
            deliver: Callable[[Any], Any] = d.errback
            result = Failure()
        else:
            deliver = d.callback
        try:
            loop.call_soon_threadsafe(deliver, result)
        except RuntimeError:  # the loop has closed: nobody is left to be told
            pass

    reactor.getThreadPool().callInThread(work)
    return d
