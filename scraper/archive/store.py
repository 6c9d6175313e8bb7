"""Where archive files live: a folder, an S3-compatible bucket, or a GCS bucket (:mod:`.gcs`).

Files are written locally and only read back by byte range, so a store needs five operations.
Buckets have no append: a bucket's store receives each file whole once it is rotated.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from typing import Any, Protocol

from ..runtime.secrets import redact
from .spool import spool_path


class Store(Protocol):
    # Names this archive among every one an index has known (where revisits may point).
    location: str
    # True when a file being written is already readable where the index says (a folder):
    # its index rows can be written before the file is closed.
    readable_while_open: bool

    def local_path(self, name: str) -> str: ...
    def publish(self, name: str) -> None: ...
    def read(self, name: str, offset: int, length: int) -> bytes: ...
    def delete(self, name: str) -> None: ...
    def names(self) -> Iterator[str]: ...


class FolderStore:
    readable_while_open = True

    def __init__(self, root: str) -> None:
        self.root = root[len("file://") :] if root.startswith("file://") else root
        # A folder is this machine's: the same path on two machines is two archives.
        self.location = f"file://{socket.gethostname()}{os.path.abspath(self.root)}"

    def local_path(self, name: str) -> str:
        path = os.path.join(self.root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path

    def publish(self, name: str) -> None:
        pass  # written in place

    def read(self, name: str, offset: int, length: int) -> bytes:
        with open(os.path.join(self.root, name), "rb") as f:
            f.seek(offset)
            return f.read(length)

    def delete(self, name: str) -> None:
        try:
            os.remove(os.path.join(self.root, name))
        except FileNotFoundError:
            pass

    def names(self) -> Iterator[str]:
        for folder, _dirs, files in os.walk(self.root):
            for file in files:
                if file.endswith(".warc.gz"):
                    yield os.path.relpath(os.path.join(folder, file), self.root)


class S3Store:
    readable_while_open = False

    def __init__(self, url: str, spool: str, endpoint: str | None = None) -> None:
        import boto3

        bucket, _, prefix = url[len("s3://") :].partition("/")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.location = f"s3://{bucket}/{self.prefix}" + (f" at {redact(endpoint)}" if endpoint else "")
        self.spool = spool
        from botocore.config import Config

        # Credentials and region come from the environment (AWS_*), as boto3 reads them. Bounded
        # timeouts and retries: a bucket that stops answering fails the upload (and stops the
        # archive, loudly) within about a minute, never holding the crawl's shutdown for longer.
        self.client: Any = boto3.client(
            "s3",
            endpoint_url=endpoint,
            config=Config(connect_timeout=10, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"}),
        )

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def local_path(self, name: str) -> str:
        return spool_path(self.spool, name)

    def publish(self, name: str) -> None:
        path = os.path.join(self.spool, name)
        self.client.upload_file(path, self.bucket, self._key(name))
        os.remove(path)

    def read(self, name: str, offset: int, length: int) -> bytes:
        answer = self.client.get_object(
            Bucket=self.bucket, Key=self._key(name), Range=f"bytes={offset}-{offset + length - 1}"
        )
        return answer["Body"].read()

    def delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(name))

    def names(self) -> Iterator[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.prefix}/" if self.prefix else ""
        )
        for page in pages:
            for obj in page.get("Contents", []):
                key = obj["Key"]
                yield key[len(self.prefix) + 1 :] if self.prefix else key


def store_for(url: str, data_dir: str, endpoint: str | None = None) -> Store:
    """The store for ``ARCHIVE_URL``; *endpoint* is that kind of bucket's endpoint setting."""
    if url.startswith("s3://"):
        return S3Store(url, os.path.join(data_dir, "archive-spool"), endpoint)
    if url.startswith("gs://"):
        from .gcs import GcsStore

        return GcsStore(url, os.path.join(data_dir, "archive-spool"), endpoint)
    return FolderStore(url)


def remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
