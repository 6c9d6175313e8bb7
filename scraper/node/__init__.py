"""The crawl node: the scheduler that wires a process into the fleet (the shared queue and its
leases, the seen-set, the run it joins, the gone-marking when the run finishes).

Above :mod:`scraper.queue` (the frontier), :mod:`scraper.runs` (run state, nodes) and
:mod:`scraper.storage`; nothing below imports it.
"""
