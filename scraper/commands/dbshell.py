"""``scrapy dbshell [-c SQL] [psql options]``: psql on the crawl's database.

The database is ``DATABASE_URL``, or the embedded Postgres under ``DATA_DIR`` (started if it is
not running, stopped again when psql exits if this command started it). psql is the one bundled
with the embedded Postgres for the embedded database (the same version), otherwise the system's
(``PSQL`` names another). The password travels in ``PGPASSWORD``, never on the command line,
where ``ps`` would show it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from argparse import ArgumentParser, Namespace
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from scrapy.commands import ScrapyCommand

from . import backends_or_report, report_error


def bundled_psql() -> str | None:
    """The psql that comes with the embedded Postgres (pgserver), if installed."""
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            import pgserver
    except ImportError:
        return None
    path = Path(pgserver.__file__).parent / "pginstall" / "bin" / "psql"
    return str(path) if path.is_file() else None


def find_psql(embedded: bool) -> str | None:
    if os.environ.get("PSQL"):
        return os.environ["PSQL"]
    candidates = [bundled_psql(), shutil.which("psql")] if embedded else [shutil.which("psql"), bundled_psql()]
    return next((c for c in candidates if c), None)


def split_password(url: str) -> tuple[str, str | None]:
    """*url* without its password, and the password (for ``PGPASSWORD``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}@{host}", parts.path, parts.query, parts.fragment)), unquote(
        parts.password
    )


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False  # no crawl: no Scrapy banner either

    def syntax(self) -> str:
        return "[-c SQL] [psql options]"

    def short_desc(self) -> str:
        return "Open psql on the crawl's database (the embedded one is started if needed)"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("-c", "--command", dest="sql", default=None, help="run this SQL and exit")

    def run(self, args: list[str], opts: Namespace) -> None:
        found = backends_or_report(self, need_redis=False)
        if found is None:
            return
        psql = find_psql(found.embedded_postgres)
        if psql is None:
            return report_error(self, "dbshell: psql not found: install the PostgreSQL client, or set PSQL to its path")
        dsn, password = split_password(found.database_url)
        env = dict(os.environ)
        if password is not None:
            env["PGPASSWORD"] = password
        command = [psql, dsn, *(["-c", opts.sql] if opts.sql else []), *args]
        try:
            # Not exec: this process holds the embedded server, which stops when it exits.
            self.exitcode = subprocess.call(command, env=env)
        except OSError as exc:
            report_error(self, f"dbshell: cannot run {psql}: {exc.strerror}")
