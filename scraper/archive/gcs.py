"""The archive in a Google Cloud Storage bucket (``ARCHIVE_URL=gs://bucket/prefix``), through
pyarrow's GCS file system: pyarrow is a runtime dependency already, and its GCS client is
Google's own C++ one, which finds credentials the way every Google client does.

Like S3, GCS has no append: a file is spooled locally and uploaded whole once it is rotated.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from ..runtime.secrets import redact
from .spool import spool_path

# A call that fails (connection refused, 5xx, 429) is retried until this has passed, then
# raises: a bucket that stops answering fails the upload, and stops the archive loudly, within
# about a minute instead of holding the crawl's shutdown (the client's backoff can stretch the
# last wait: 40-50 s measured against a stopped server). pyarrow does not expose the client's
# stall timeout: a server that accepts the connection and then goes silent is given up after
# the client's own 120 s (measured), whatever this limit.
RETRY_TIME_LIMIT = timedelta(seconds=30)
# Opened objects kept for range reads (see GcsStore.read).
OPEN_OBJECTS = 16


def parse_bucket(url: str) -> tuple[str, str]:
    """``gs://bucket/some/prefix`` -> (``bucket``, ``some/prefix``)."""
    bucket, _, prefix = url[len("gs://") :].partition("/")
    return bucket, prefix.strip("/")


class GcsStore:
    readable_while_open = False

    def __init__(
        self, url: str, spool: str, endpoint: str | None = None, retry_time_limit: timedelta = RETRY_TIME_LIMIT
    ) -> None:
        from pyarrow import fs

        self.bucket, self.prefix = parse_bucket(url)
        self.location = f"gs://{self.bucket}/{self.prefix}" + (f" at {redact(endpoint)}" if endpoint else "")
        self.spool = spool
        if endpoint:
            # An emulator or a GCS-compatible server: reached anonymously (no Google token is
            # fetched, none is sent), over the scheme its URL names.
            parts = urlsplit(endpoint)
            self.fs: Any = fs.GcsFileSystem(
                anonymous=True,
                scheme=parts.scheme,
                endpoint_override=parts.netloc,
                retry_time_limit=retry_time_limit,
            )
        else:
            # Google's default credentials: GOOGLE_APPLICATION_CREDENTIALS, gcloud's application
            # default login, or the metadata server of a Google Cloud machine.
            self.fs = fs.GcsFileSystem(retry_time_limit=retry_time_limit)
        self._open: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"GcsStore({self.location!r})"

    def _path(self, name: str) -> str:
        return f"{self.bucket}/{self.prefix}/{name}" if self.prefix else f"{self.bucket}/{name}"

    def local_path(self, name: str) -> str:
        return spool_path(self.spool, name)

    def publish(self, name: str) -> None:
        import pyarrow as pa

        path = os.path.join(self.spool, name)
        # One write of the whole mapped file: closing a GCS stream commits what it holds, so an
        # error raised between two writes of ours would leave a truncated object under the real
        # name. A failed upload commits nothing (the resumable session is never finalised).
        # compression=None: pyarrow would otherwise gzip the bytes again, for the name's ".gz".
        with (
            pa.memory_map(path) as source,
            self.fs.open_output_stream(self._path(name), compression=None) as out,
        ):
            out.write(source.read_buffer())  # zero-copy: valid while the map is open
        os.remove(path)

    def read(self, name: str, offset: int, length: int) -> bytes:
        # Each read_at is one ranged GET. Opening an object costs more: a metadata GET, and a GET
        # of the whole object that pyarrow starts before the first ranged read and leaves paused
        # until the file is closed (what is in flight by then is dropped). Objects are kept open
        # here so that is paid once per object, not once per record.
        return self._object(name).read_at(length, offset)

    def _object(self, name: str) -> Any:
        with self._lock:
            handle = self._open.get(name)
            if handle is not None:
                self._open.move_to_end(name)
                return handle
            handle = self.fs.open_input_file(self._path(name))
            # pyarrow's GCS file starts its whole-object stream lazily, unguarded: started here,
            # under the lock, concurrent read_at calls (replay threads) never race to start it.
            _ = handle.closed
            self._open[name] = handle
            if len(self._open) > OPEN_OBJECTS:
                # Dropped, not closed: a read still using it holds its own reference.
                self._open.popitem(last=False)
            return handle

    def delete(self, name: str) -> None:
        with self._lock:
            self._open.pop(name, None)
        try:
            self.fs.delete_file(self._path(name))
        except FileNotFoundError:
            pass  # already gone: what a delete wants

    def names(self) -> Iterator[str]:
        from pyarrow import fs

        base = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        infos = self.fs.get_file_info(fs.FileSelector(base, recursive=True, allow_not_found=True))
        if not infos and self.fs.get_file_info(self.bucket).type == fs.FileType.NotFound:
            # allow_not_found also hides a missing bucket: say so rather than list nothing.
            raise FileNotFoundError(f"GCS bucket {self.bucket!r} does not exist")
        for info in infos:
            if info.type == fs.FileType.File and info.path.endswith(".warc.gz"):
                yield info.path[len(base) + 1 :]
