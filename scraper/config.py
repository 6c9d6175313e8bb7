"""Typed, validated access to our own settings.

Every component reads its settings through these helpers so that a bad value fails at start
with one line that names the setting, instead of a traceback deep inside a component.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from scrapy.settings import BaseSettings

from .conf.registry import REGISTRY, SIMPLE
from .conf.registry import get as declared


class ConfigError(Exception):
    """A setting is missing, malformed or points at something unreachable.

    The message always starts with the setting's name and never contains a password.
    """


def mask_url(url: str | None) -> str:
    """Return *url* with its password (and any query-string secret) replaced by ``***``."""
    if not url:
        return ""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, _sep, password = userinfo.partition(":")
        netloc = f"{user}:***@{hostport}" if password else f"{user}@{hostport}"
    query = "&".join(
        f"{k}=***" if k.lower() in {"password", "pass", "secret", "key", "token"} else f"{k}={v}"
        for k, _, v in (pair.partition("=") for pair in parts.query.split("&") if pair)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


_REGISTRY = object()  # a getter's default: the registry's (scraper/conf/registry.py)


def _declared(name: str, default: Any, minimum: Any = None, maximum: Any = None) -> tuple[Any, Any, Any]:
    """The default and bounds a getter applies: those given, else the registry's."""
    if default is not _REGISTRY and minimum is not None and maximum is not None:
        return default, minimum, maximum
    return _registry_default(name, default), *_registry_bounds(name, minimum, maximum)


def _registry_default(name: str, default: Any) -> Any:
    """*default*, or the registry's when the getter gave none."""
    if default is not _REGISTRY:
        return default
    setting = REGISTRY.get(name)
    if setting is None:
        raise KeyError(f"{name} is not a declared setting (scraper/conf/registry.py): give a default")
    return setting.default


def _registry_bounds(name: str, minimum: Any, maximum: Any) -> tuple[Any, Any]:
    setting = REGISTRY.get(name)
    if setting is None:
        return minimum, maximum
    return (setting.minimum if minimum is None else minimum, setting.maximum if maximum is None else maximum)


def _bounded(name: str, value: float, minimum: Any, maximum: Any) -> None:
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name}: must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name}: must be at most {maximum}, got {value}")


def get_int(
    settings: BaseSettings, name: str, default: Any = _REGISTRY, minimum: int | None = None, maximum: int | None = None
) -> int:
    """An integer setting, checked against its bounds; unset: *default*, else the registry's."""
    default, minimum, maximum = _declared(name, default, minimum, maximum)
    raw = settings.get(name, default)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None
    _bounded(name, value, minimum, maximum)
    return value


def get_float(
    settings: BaseSettings,
    name: str,
    default: Any = _REGISTRY,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    """A number setting, checked against its bounds; unset: *default*, else the registry's."""
    default, minimum, maximum = _declared(name, default, minimum, maximum)
    raw = settings.get(name, default)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected a number, got {raw!r}") from None
    if value != value:
        raise ConfigError(f"{name}: expected a number, got {raw!r}")
    _bounded(name, value, minimum, maximum)
    return value


def get_text(settings: BaseSettings, name: str, default: Any = _REGISTRY) -> str:
    """A text setting, stripped; unset: *default*, else the registry's (set to nothing: "")."""
    return str(settings.get(name, _registry_default(name, default)) or "").strip()


def get_bool(settings: BaseSettings, name: str, default: Any = _REGISTRY) -> bool:
    """A true/false setting (1/0, yes/no, on/off too); unset: *default*, else the registry's."""
    default = _registry_default(name, default)
    raw: Any = settings.get(name, default)
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off", ""}:
        return False
    raise ConfigError(f"{name}: expected true/false, got {raw!r}")


def get_choice(settings: BaseSettings, name: str, default: Any = _REGISTRY, choices: tuple[str, ...] = ()) -> str:
    """One of *choices* (else the registry's), lower case; unset: *default*, else the registry's."""
    default = _registry_default(name, default)
    if not choices:
        choices = declared(name).choices
    value = str(settings.get(name, default) or default).strip().lower()
    if value not in choices:
        raise ConfigError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
    return value


def domain_entries(value: object, name: str, expected: str, separators: str = ",") -> list[tuple[Any, Any]]:
    """``a.test=x,b.test=y`` (or a dict of the same) -> [(domain, spec)], empty entries skipped.

    *expected* describes one entry for the error, which names the setting *name*."""
    if isinstance(value, dict):
        return list(value.items())
    text = str(value or "")
    for separator in separators[1:]:
        text = text.replace(separator, separators[0])
    entries = []
    for part in text.split(separators[0]):
        part = part.strip()
        if not part:
            continue
        domain, sep, spec = part.partition("=")
        if not sep:
            raise ConfigError(f"{name}: expected {expected}, got {part!r}")
        entries.append((domain, spec))
    return entries


# The placeholder passwords of .env.example: a deployment still using one is open to anyone
# who reads the example (see docs/operations/security.md).
PLACEHOLDERS = ("change-me", "changeme")


def refuse_placeholder_password(name: str, url: str) -> None:
    """Raise ConfigError naming *name* when *url* carries a placeholder password."""
    if not url:
        return
    try:
        password = urlsplit(url).password
    except ValueError:
        return  # a malformed URL is said by the check that connects
    if password is not None and unquote(password).lower().startswith(PLACEHOLDERS):
        raise ConfigError(
            f"{name}: its password is the placeholder {unquote(password)!r} of .env.example; "
            "set a real one (openssl rand -hex 24)"
        )


def check_declared(settings: BaseSettings) -> None:
    """Validate every declared number, switch and choice (type, bounds, choices) that is set;
    ConfigError names the first bad one."""
    for setting in REGISTRY.values():
        if setting.kind not in SIMPLE or settings.get(setting.name) is None:
            continue
        if setting.kind == "int":
            get_int(settings, setting.name)
        elif setting.kind in ("float", "fraction"):
            get_float(settings, setting.name)
        elif setting.kind == "bool":
            get_bool(settings, setting.name)
        else:
            get_choice(settings, setting.name)
