"""A database of a bench's own on the server of DATABASE_URL: made empty, then dropped."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import psycopg2


def drop_database(url: str, name: str) -> None:
    admin = psycopg2.connect(url)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    admin.close()


def scratch_database(url: str, name: str) -> str:
    """Database *name* made anew next to *url*'s; its URL."""
    drop_database(url, name)
    admin = psycopg2.connect(url)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    admin.close()
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))
