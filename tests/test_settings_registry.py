"""One settings registry: the code reads no setting it lacks, no default in code disagrees with it,
settings.py and the reference page come from it, and every bad value fails at start by name.
No crawl processes: the code is read as text (its syntax tree)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scrapy.settings import Settings, default_settings

from scraper.conf import reference, registry
from scraper.config import ConfigError, check_declared

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "scraper"
SCRAPY_NAMES = {name for name in dir(default_settings) if name.isupper()}
GETTERS = {"get_int", "get_float", "get_bool", "get_choice", "_fraction", "_json_setting"}
SETTINGS_METHODS = {
    "get",
    "getint",
    "getfloat",
    "getbool",
    "getlist",
    "getdict",
    "getwithbase",
    "set",
    "setdefault",
    "getpriority",
}
# Names given through a module constant rather than a literal (``shared_state.SETTING``...).
CONSTANTS = {"SETTING", "PROCESSOR_SETTING"}
# Keys of other libraries' settings dicts that the scan cannot tell apart (dateparser's).
NOT_SCRAPY = {"DATE_ORDER"}


def _is_name(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.isupper()
        and len(node.value) > 2
        and node.value.replace("_", "").isalnum()
    )


def _settings_like(node: ast.AST) -> bool:
    return "settings" in ast.unparse(node).lower()


def settings_read() -> dict[str, list[tuple[str, int, ast.Call | None]]]:
    """Every setting name the package reads or sets, with where and the call."""
    found: dict[str, list[tuple[str, int, ast.Call | None]]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.parts[-2:] == ("conf", "registry.py") or "demo_site" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = {
            t.id: n.value.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name) and t.id in CONSTANTS and isinstance(n.value, ast.Constant)
        }
        for node in ast.walk(tree):
            name, call = None, None
            if isinstance(node, ast.Call):
                func = node.func
                fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if fname in GETTERS and len(node.args) >= 2 and _is_name(node.args[1]):
                    name, call = node.args[1].value, node
                elif (
                    fname in SETTINGS_METHODS
                    and isinstance(func, ast.Attribute)
                    and _settings_like(func.value)
                    and node.args
                    and _is_name(node.args[0])
                ):
                    name = node.args[0].value
            elif isinstance(node, ast.Subscript) and _settings_like(node.value) and _is_name(node.slice):
                name = node.slice.value
            if name is not None:
                found.setdefault(name, []).append((str(path.relative_to(ROOT)), node.lineno, call))
        for value in constants.values():
            found.setdefault(value, []).append((str(path.relative_to(ROOT)), 0, None))
    return found


def test_code_reads_no_setting_the_registry_lacks() -> None:
    read = settings_read()
    assert len(read) > 80  # the scan sees the code's reads
    ours = {
        name
        for name in read
        if name not in SCRAPY_NAMES and name not in registry.SCRAPY_REDIS and name not in NOT_SCRAPY
    }
    undeclared = sorted(ours - set(registry.REGISTRY))
    assert not undeclared, {name: read[name][:2] for name in undeclared}


def test_every_declared_setting_is_read_by_the_code() -> None:
    read = settings_read()
    source = "\n".join(
        p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py") if p.parts[-2:] != ("conf", "registry.py")
    )
    # Scrapy's own are read by Scrapy.
    unused = [
        name
        for name, setting in registry.REGISTRY.items()
        if not setting.scrapy and name not in read and f'"{name}"' not in source
    ]
    assert not unused, unused


def _literal(node: ast.AST) -> object:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast  # not a literal: the code computes it (e.g. from another setting)


def test_no_default_in_code_disagrees_with_the_registry() -> None:
    disagree = []
    for name, places in settings_read().items():
        declared = registry.REGISTRY.get(name)
        if declared is None:
            continue
        for path, line, call in places:
            if call is None or len(call.args) < 3:
                continue
            value = _literal(call.args[2])
            if value is ast:
                continue
            if declared.kind == "json":
                same = json.loads(declared.default) == value
            elif isinstance(declared.default, bool) or isinstance(value, bool):
                same = value == declared.default
            elif isinstance(value, (int, float)) and declared.default is not None:
                same = float(value) == float(declared.default)
            else:
                same = value == declared.default
            if not same:
                disagree.append((name, path, line, value, declared.default))
    assert not disagree, disagree


def test_settings_py_takes_each_environment_setting_from_the_registry() -> None:
    env = {k: v for k, v in os.environ.items() if k not in registry.REGISTRY}
    env["POLITENESS_RATE"] = "2.5"
    env["QUALITY_ON_BREAK"] = ""  # empty: the default
    names = sorted(registry.REGISTRY)
    script = (
        "import json; from scrapy.utils.project import get_project_settings as g; s = g(); "
        f"print(json.dumps({{k: s.get(k) for k in {names!r}}}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    values = json.loads(out)
    assert values["POLITENESS_RATE"] == "2.5" and values["QUALITY_ON_BREAK"] == "hold"
    for name, setting in registry.REGISTRY.items():
        if name == "POLITENESS_RATE" or not setting.env:
            continue
        assert values[name] == setting.text_default(), (name, values[name], setting.default)


def test_the_reference_page_is_rendered_from_the_registry() -> None:
    page = ROOT / "docs" / "reference" / "settings.md"
    assert page.read_text(encoding="utf-8") == reference.render(), (
        "docs/reference/settings.md is stale: python -m scraper.conf.reference > docs/reference/settings.md"
    )
    for name in registry.REGISTRY:
        assert f"`{name}`" in page.read_text(encoding="utf-8")


BAD = {"int": "1.5x", "float": "fast", "fraction": "half", "bool": "maybe", "choice": "neither"}


@pytest.mark.parametrize("name", [n for n, s in registry.REGISTRY.items() if s.kind in registry.SIMPLE])
def test_a_bad_value_fails_naming_the_setting(name: str) -> None:
    setting = registry.REGISTRY[name]
    with pytest.raises(ConfigError, match=rf"^{name}: "):
        check_declared(Settings({name: BAD[setting.kind]}))
    if setting.minimum is not None:
        with pytest.raises(ConfigError, match=rf"^{name}: must be at least"):
            check_declared(Settings({name: str(setting.minimum - 1)}))
    if setting.default is not None:
        check_declared(Settings({name: setting.text_default()}))  # the default itself passes
