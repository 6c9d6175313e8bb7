"""Helpers the tests share: crawls as processes, waiting, the stats dump, servers a test starts,
the binaries they need. Fixtures live in conftest.py; test modules never import one another."""
