"""``scrapy feed ddl``: what Snowflake and BigQuery need to read the lake's tables.

Both read an Iceberg table from its metadata file in the bucket, without our catalog: Snowflake
through a catalog integration for files in object storage and an external volume, BigQuery
through an external table over a Cloud Storage connection. A metadata file names one snapshot,
so each commit of the relay needs the warehouse told again: Snowflake with ``ALTER ICEBERG TABLE
... REFRESH``, BigQuery by replacing the external table (printed with ``--refresh``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

WAREHOUSES = ("snowflake", "bigquery")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _relative(metadata_location: str, base: str) -> str:
    """*metadata_location* relative to the external volume's storage location *base* (the
    lake's location, as Snowflake's METADATA_FILE_PATH wants it)."""
    prefix = base.rstrip("/") + "/"
    return metadata_location[len(prefix) :] if metadata_location.startswith(prefix) else metadata_location


def snowflake(tables: dict[str, Any], base: str, volume: str, integration: str, refresh: bool) -> str:
    lines = []
    if not refresh:
        lines += [
            f"-- The external volume {volume} must point at {base} (CREATE EXTERNAL VOLUME).",
            f"CREATE CATALOG INTEGRATION IF NOT EXISTS {integration}",
            "  CATALOG_SOURCE = OBJECT_STORE TABLE_FORMAT = ICEBERG ENABLED = TRUE;",
        ]
    for name, table in tables.items():
        path = _quote(_relative(table.metadata_location, base))
        if refresh:
            lines.append(f"ALTER ICEBERG TABLE {name} REFRESH {path};")
        else:
            lines.append(
                f"CREATE ICEBERG TABLE IF NOT EXISTS {name} EXTERNAL_VOLUME = {_quote(volume)}"
                f" CATALOG = {_quote(integration)} METADATA_FILE_PATH = {path};"
            )
    return "\n".join(lines)


def bigquery(tables: dict[str, Any], dataset: str, connection: str, refresh: bool) -> str:
    lines = []
    for name, table in tables.items():
        verb = "CREATE OR REPLACE EXTERNAL TABLE" if refresh else "CREATE EXTERNAL TABLE IF NOT EXISTS"
        lines.append(
            f"{verb} `{dataset}.{name}` WITH CONNECTION `{connection}`"
            f' OPTIONS (format = "ICEBERG", uris = ["{table.metadata_location}"]);'
        )
    return "\n".join(lines)


def problems(location: str, warehouse: str) -> list[str]:
    """Why *warehouse* cannot read a lake at *location* (empty: it can)."""
    scheme = urlsplit(location).scheme
    if warehouse == "bigquery" and scheme != "gs":
        return [f"BigQuery reads Iceberg tables from Cloud Storage only; the lake is at {location or 'no location'}"]
    if warehouse == "snowflake" and scheme not in ("s3", "gs"):
        return [f"Snowflake reads Iceberg tables from a bucket (S3, GCS); the lake is in a folder ({location})"]
    return []
