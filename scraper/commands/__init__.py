"""Operator commands (``COMMANDS_MODULE``): crawl, seed, migrate."""
