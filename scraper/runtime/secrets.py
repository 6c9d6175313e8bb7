"""Keep secret values (passwords in URLs, API keys) out of every log line.

Scrapy logs the value of every overridden setting at start, and libraries put URLs into their
error messages. Rather than hope each call site masks, every log record is redacted once, as it
is created, for every secret registered here.
"""

from __future__ import annotations

import logging
import threading
import traceback
from urllib.parse import unquote, urlsplit

_secrets: set[str] = set()
_lock = threading.Lock()
_installed = False
MIN_SECRET_LENGTH = 4  # shorter values would mask ordinary words; such secrets are weak anyway


def register_secret(value: str | None) -> None:
    if value and len(value) >= MIN_SECRET_LENGTH:
        with _lock:
            _secrets.add(value)
            if unquote(value) != value:
                _secrets.add(unquote(value))


def register_url_password(url: str | None) -> None:
    """Register the password part of a connection URL, if it has one."""
    if not url:
        return
    try:
        password = urlsplit(url).password
    except ValueError:
        return
    register_secret(password)


def redact(text: str) -> str:
    for secret in sorted(_secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, "***")
    return text


def install_log_redaction() -> None:
    """Wrap the log record factory so that every record's final text is redacted."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs):  # type: ignore[no-untyped-def]
        record = previous(*args, **kwargs)
        if not _secrets:
            return record
        try:
            message = record.getMessage()
        except Exception:  # a broken format string is the caller's bug; leave it to the handler
            return record
        record.msg, record.args = redact(message), None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)).rstrip())
            record.exc_info = None
        return record

    logging.setLogRecordFactory(factory)
