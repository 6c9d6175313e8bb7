"""Results of work in the thread pool reach the reactor in one pass of the event loop.

Run in a process of its own: the test installs the asyncio reactor, as ``scrapy crawl`` does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from support.crawls import ROOT

_SCRIPT = textwrap.dedent(
    """
    import json, sys, threading, time
    from scrapy.utils.reactor import install_reactor
    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    from twisted.internet import reactor, threads
    from scraper.runtime.worker_threads import defer_to_thread

    loop = reactor._asyncioEventloop
    out = {}

    def passes_until_fired(start, name):
        # The worker is done (and has handed its result over) before the reactor thread looks
        # again; then count the passes of the loop that run before the Deferred fires.
        finished = threading.Event()
        def work():
            finished.set()
            if name.endswith("error"):
                raise KeyError("no such row")
            return 42
        d = start(work)
        finished.wait(5)
        time.sleep(0.05)
        passes = [0]
        fired = {}
        def tick():
            passes[0] += 1
            if not fired and passes[0] < 20:
                loop.call_soon(tick)
        def got(result):
            fired.update(passes=passes[0], thread=threading.current_thread() is threading.main_thread(),
                         result=repr(getattr(result, "value", result)))
        d.addBoth(got)
        loop.call_soon(tick)
        return fired

    cases = [("ours", defer_to_thread), ("ours error", defer_to_thread), ("twisted", threads.deferToThread)]

    def run():
        # One case at a time, each from a fresh pass, so that their passes do not interleave.
        if not cases:
            reactor.stop()
            return
        name, start = cases.pop(0)
        out[name] = passes_until_fired(start, name)
        reactor.callLater(0.2, run)

    reactor.callWhenRunning(lambda: reactor.callLater(0, run))
    reactor.run()
    print(json.dumps(out))
    """
)


def test_the_result_fires_at_the_next_pass_on_the_reactor_thread() -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # Fired at the first pass after the handover, ahead of anything scheduled after it.
    assert out["ours"] == {"passes": 0, "thread": True, "result": "42"}
    assert out["ours error"] == {"passes": 0, "thread": True, "result": "KeyError('no such row')"}
    # Twisted's own way back lets whole passes run first (what this module saves per batch).
    assert out["twisted"]["passes"] >= 1 and out["twisted"]["result"] == "42"
