"""One settings registry: the code reads no setting it lacks, no default in code disagrees with it,
settings.py and the reference page come from it, and every bad value fails at start by name.
No crawl processes: the code is read as text (its syntax tree)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
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
# Keys of other libraries' settings dicts that the scan cannot tell apart (dateparser's).
NOT_SCRAPY = {"DATE_ORDER"}
# Environment variables the code reads that are no settings, each with why.
NOT_SETTINGS = {
    "PSQL": "scrapy dbshell's psql binary, for that command alone",
    "SCRAPING_API_STANDIN_KEY": "the local scraping-API stand-in's own key (a development tool)",
    # The clouds' own variables, read as their tools read them (the lake's bucket): credentials
    # never become settings of ours, so they never reach a log line.
    "AWS_REGION": "the lake's S3 region, as AWS' tools read it",
    "AWS_DEFAULT_REGION": "the lake's S3 region, as AWS' tools read it",
    "GOOGLE_APPLICATION_CREDENTIALS": "Google's default credentials for the lake's GCS bucket",
}
# A message telling the operator to give a setting: ``-s SOME_SETTING=VALUE`` (``NAME``: any).
GIVEN = re.compile(r"-s (?!NAME=)([A-Z][A-Z0-9_]{2,})=")
ENVIRON = {"os.environ", "environ"}


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


def _constants(tree: ast.Module) -> dict[str, object]:
    """The module's top-level constants: ``SETTING = "SHARED_STATE"``, ``REPLAY_SETTINGS = {...}``."""
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if _is_name(node.value) or isinstance(node.value, ast.Dict):
                found[node.targets[0].id] = node.value
    return found


def _setting(node: ast.AST | None, constants: dict[str, object]) -> str | None:
    """The setting name *node* gives: a literal, or a module constant holding one."""
    if isinstance(node, ast.Name):
        node = constants.get(node.id)  # type: ignore[assignment]
    return node.value if node is not None and _is_name(node) else None


def settings_read(paths: list[Path] | None = None) -> dict[str, list[tuple[str, int, ast.Call | None]]]:
    """Every setting name the package reads or sets, with where and the call (None where no
    call's default is to compare): through the settings object and the project's getters,
    ``in settings``, the environment, a module constant, a dict of settings a command sets or a
    spider's ``custom_settings``, ``settings.py`` itself, and a message saying ``-s NAME=...``."""
    found: dict[str, list[tuple[str, int, ast.Call | None]]] = {}
    if paths is None:
        paths = [
            p for p in PACKAGE.rglob("*.py") if p.parts[-2:] != ("conf", "registry.py") and "demo_site" not in p.parts
        ]
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        constants = _constants(tree)

        def add(name: str | None, line: int, call: ast.Call | None = None, where: str = where) -> None:
            if name is not None:
                found.setdefault(name, []).append((where, line, call))

        if path == PACKAGE / "settings.py":
            for node in tree.body:
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name) and target.id.isupper():
                            add(target.id, node.lineno)
        for name, value in constants.items():
            if name.endswith("SETTINGS") and isinstance(value, ast.Dict):
                for key in value.keys:
                    add(_setting(key, constants), value.lineno)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                receiver = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
                if fname in GETTERS and len(node.args) >= 2:
                    literal = _is_name(node.args[1])
                    add(_setting(node.args[1], constants), node.lineno, node if literal else None)
                elif fname in SETTINGS_METHODS and isinstance(func, ast.Attribute) and _settings_like(func.value):
                    if node.args:
                        literal = _is_name(node.args[0])
                        add(_setting(node.args[0], constants), node.lineno, node if literal else None)
                elif (fname == "get" and receiver in ENVIRON) or (fname == "getenv" and receiver == "os"):
                    if node.args:
                        add(_setting(node.args[0], constants), node.lineno)
            elif isinstance(node, ast.Subscript) and (_settings_like(node.value) or ast.unparse(node.value) in ENVIRON):
                add(_setting(node.slice, constants), node.lineno)
            elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
                container = node.comparators[0]
                if _settings_like(container) or ast.unparse(container) in ENVIRON:
                    add(_setting(node.left, constants), node.lineno)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
                if any(isinstance(t, ast.Name) and t.id == "custom_settings" for t in node.targets):
                    for key in node.value.keys:
                        add(_setting(key, constants), node.lineno)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                for name in GIVEN.findall(node.value):
                    add(name, node.lineno)
    return found


def test_code_reads_no_setting_the_registry_lacks() -> None:
    read = settings_read()
    assert len(read) > 80  # the scan sees the code's reads
    ours = {name for name in read if name not in SCRAPY_NAMES and name not in NOT_SCRAPY and name not in NOT_SETTINGS}
    undeclared = sorted(ours - set(registry.REGISTRY))
    assert not undeclared, {name: read[name][:2] for name in undeclared}


def test_the_scan_sees_every_way_the_code_reads_a_setting(tmp_path: Path) -> None:
    """What the scan must find, so that a setting read any of these ways without a registry entry
    fails the test above."""
    module = tmp_path / "reads.py"
    module.write_text(
        textwrap.dedent(
            """
            import os

            NAME = "A_CONSTANT"
            REPLAY_SETTINGS = {"A_COMMAND_SETS": True, NAME: 1}


            class Spider:
                custom_settings = {"A_SPIDER_SETS": 1}


            def read(settings, crawler):
                settings.get("A_GET")
                crawler.settings.getint("A_GETINT")
                get_float(settings, "A_GETTER", 1.0)
                settings.getbool(NAME)
                settings["A_SUBSCRIPT"]
                "A_MEMBER" in crawler.settings
                os.environ.get("AN_ENVIRONMENT_GET")
                os.getenv("A_GETENV")
                os.environ["AN_ENVIRONMENT_ITEM"]
                "AN_ENVIRONMENT_MEMBER" not in os.environ
                print(f"set -s A_FLAG=true to change it ({settings.get('A_GET')})")
            """
        )
    )
    assert set(settings_read([module])) == {
        "A_CONSTANT",
        "A_COMMAND_SETS",
        "A_SPIDER_SETS",
        "A_GET",
        "A_GETINT",
        "A_GETTER",
        "A_SUBSCRIPT",
        "A_MEMBER",
        "AN_ENVIRONMENT_GET",
        "A_GETENV",
        "AN_ENVIRONMENT_ITEM",
        "AN_ENVIRONMENT_MEMBER",
        "A_FLAG",
    }


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
