"""Where the lake's files live: a folder, an S3 bucket or a GCS bucket, through pyarrow.

pyiceberg's own pyarrow file IO, with two things it does not set: a bounded retry time on GCS
(pyarrow's default keeps retrying a bucket that stopped answering for 15 minutes, longer than
the relay's own patience), and anonymous access for an emulator or a GCS-compatible endpoint
named in ``CHANGEFEED_LAKE_ENDPOINT``. Credentials otherwise come from the environment, as the
clouds' own tools read them (``AWS_*``, ``GOOGLE_APPLICATION_CREDENTIALS``): none is ever a
setting of ours, so none can reach a log line.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pyarrow.fs import FileSystem, GcsFileSystem
from pyiceberg.io.pyarrow import PyArrowFileIO

SCHEMES = ("s3", "gs")
_RETRY_SECONDS = "changefeed.gcs.retry-seconds"
_ANONYMOUS = "changefeed.gcs.anonymous"


class LakeFileIO(PyArrowFileIO):
    def _initialize_gcs_fs(self) -> FileSystem:
        kwargs: dict[str, Any] = {"retry_time_limit": timedelta(seconds=float(self.properties.get(_RETRY_SECONDS, 30)))}
        if endpoint := self.properties.get("gcs.service.host"):
            parts = urlsplit(endpoint)
            kwargs["scheme"] = parts.scheme or "http"
            kwargs["endpoint_override"] = parts.netloc
        if self.properties.get(_ANONYMOUS) == "true":
            kwargs["anonymous"] = True
        return GcsFileSystem(**kwargs)


def is_bucket(location: str) -> bool:
    return urlsplit(location).scheme in SCHEMES


def warehouse(location: str) -> str:
    """The catalog's warehouse for *location*: the bucket URL as given, a folder as a file URI
    (made if missing)."""
    if is_bucket(location):
        return location.rstrip("/")
    Path(location).mkdir(parents=True, exist_ok=True)
    return Path(location).resolve().as_uri()


def properties(location: str, endpoint: str | None, timeout: float) -> dict[str, str]:
    """The file IO's properties for *location*."""
    props = {"py-io-impl": f"{LakeFileIO.__module__}.{LakeFileIO.__qualname__}"}
    scheme = urlsplit(location).scheme
    if scheme == "s3":
        # Given, so that pyarrow never asks AWS where the bucket is (it cannot, behind a private
        # endpoint or without the internet).
        props["s3.region"] = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        props["s3.connect-timeout"] = str(min(timeout, 10.0))
        props["s3.request-timeout"] = str(timeout)
        if endpoint:
            props["s3.endpoint"] = endpoint
    elif scheme == "gs":
        props[_RETRY_SECONDS] = str(timeout)
        if endpoint:
            props["gcs.service.host"] = endpoint
            # An endpoint of our choosing is an emulator or a gateway that authenticates on its
            # own; Google's credentials are for Google.
            if not os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
                props[_ANONYMOUS] = "true"
    return props
