"""The monitoring bundle under monitoring/, checked with the real promtool.

- alerts.yml is valid (promtool check rules) and passes its unit tests (promtool test rules
  alerts_test.yml); a rule that no longer fires where it should makes promtool fail.
- prometheus.yml is a valid configuration (promtool check config) once its paths point here, and
  its scraper job discovers the target files the crawl processes write.
- The Grafana dashboard parses, has a panel for every layer, and its queries are valid PromQL
  (promtool check rules on them) that name only the metrics the crawl processes export.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support.binaries import ensure_binary

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "monitoring"
ALERTS = MONITORING / "alerts.yml"
ALERTS_TEST = MONITORING / "alerts_test.yml"
PROMETHEUS_CONFIG = MONITORING / "prometheus.yml"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "scraper.json"
DATASOURCES = MONITORING / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = MONITORING / "grafana" / "provisioning" / "dashboards" / "scraper.yml"

ALERT_NAMES = {
    "ScraperQueueTampered",
    "ScraperQueueBacklog",
    "ScraperHighErrorRate",
    "ScraperCrawlStalled",
    "ScraperApiBudgetNearlySpent",
    "ScraperStorageWriteFailures",
    "ScraperStorageBehind",
    "ScraperDeadLetters",
    "ScraperFieldCoverageLow",
    "ScraperLastRunDegraded",
    "ScraperProcessingBehind",
    "ScraperRedisRefusingWrites",
    "ScraperArchiveFailing",
    "ScraperQualityGuardBroken",
    "ScraperFieldRepaired",
    "ScraperChangefeedSinkDown",
    "ScraperChangefeedDeadLetters",
}

# What every crawl process exports, by type.
COUNTERS = {
    "scraper_requests_total",
    "scraper_responses_total",
    "scraper_errors_total",
    "scraper_api_credits_total",
    "scraper_queue_enqueued_total",
    "scraper_queue_dequeued_total",
    "scraper_items_scraped_total",
    "scraper_items_dropped_total",
    "scraper_items_rejected_total",
    "scraper_items_stored_total",
    "scraper_storage_rows_written_total",
    "scraper_storage_write_failures_total",
    "scraper_queue_redelivered_total",
    "scraper_dead_letters_total",
    "scraper_politeness_wait_seconds_total",
    "scraper_redis_write_refusals_total",
    "scraper_archive_not_archived_total",
    "scraper_quality_held_items_total",
    "scraper_politeness_throttled_total",
    "scraper_revisit_pages_total",
    "scraper_repairs_total",
    "scraper_repair_items_total",
    # The change feed's relay (scraper/feed/metrics.py), labelled by sink.
    "scraper_changefeed_events_published_total",
    "scraper_changefeed_dead_letters_total",
    "scraper_changefeed_retries_total",
}
GAUGES = {
    "scraper_api_budget_credits",
    "scraper_api_run_spent_credits",
    "scraper_queue_depth",
    "scraper_queue_oldest_age_seconds",
    "scraper_processing_pending_responses",
    "scraper_processing_max_pending_responses",
    "scraper_dupefilter_size",
    "scraper_storage_pending_rows",
    "scraper_storage_max_pending_rows",
    "scraper_spider_open",
    "scraper_last_response_timestamp_seconds",
    "scraper_run_info",
    "scraper_run_started_timestamp_seconds",
    "scraper_run_nodes",
    "scraper_run_pages",
    "scraper_run_items",
    "scraper_run_dead_letters",
    "scraper_run_api_credits",
    "scraper_run_redeliveries",
    "scraper_run_throttled",
    "scraper_run_not_archived",
    "scraper_field_coverage",
    "scraper_field_coverage_expected",
    "scraper_field_coverage_items",
    "scraper_quality_baseline_items",
    "scraper_quality_last_run_degraded",
    "scraper_quality_last_run_failed_checks",
    "scraper_quality_guard_broken",
    "scraper_politeness_rate",
    "scraper_changefeed_sink_up",
    "scraper_changefeed_lag_seconds",
    "scraper_changefeed_last_publish_timestamp_seconds",
}
HISTOGRAMS = {"scraper_download_latency_seconds", "scraper_pipeline_seconds"}
SUMMARIES = {"scraper_storage_flush_seconds"}
# Series names a query can select: a histogram or summary only exists as its suffixed series.
SERIES_NAMES = (
    COUNTERS
    | GAUGES
    | {h + s for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}
    | {m + s for m in SUMMARIES for s in ("_sum", "_count")}
)
LABELS = {
    "spider",
    "status_class",
    "domain",
    "kind",
    "reason",
    "outcome",
    "le",
    "job",
    "instance",
    "run",
    "state",
    "item_type",
    "field",
    "sink",
}

# The series each layer's row must show.
LAYERS = {
    "Ingest": {
        "scraper_requests_total",
        "scraper_responses_total",
        "scraper_download_latency_seconds_bucket",
        "scraper_errors_total",
        "scraper_api_credits_total",
        "scraper_api_budget_credits",
    },
    "Queue": {
        "scraper_queue_depth",
        "scraper_queue_oldest_age_seconds",
        "scraper_queue_enqueued_total",
        "scraper_queue_dequeued_total",
        "scraper_dupefilter_size",
    },
    "Workers": {
        "scraper_items_scraped_total",
        "scraper_items_stored_total",
        "scraper_items_rejected_total",
        "scraper_items_dropped_total",
        "scraper_pipeline_seconds_bucket",
    },
    "Runs": {"scraper_run_info", "scraper_run_nodes", "scraper_run_pages", "scraper_run_items"},
    "Data quality": {
        "scraper_field_coverage",
        "scraper_field_coverage_expected",
        "scraper_quality_baseline_items",
        "scraper_quality_last_run_degraded",
    },
    "Storage": {
        "scraper_storage_rows_written_total",
        "scraper_storage_flush_seconds_sum",
        "scraper_storage_flush_seconds_count",
        "scraper_storage_write_failures_total",
        "scraper_storage_pending_rows",
    },
}


@pytest.fixture(scope="module")
def promtool() -> str:
    return ensure_binary("promtool", "prometheus")


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120, cwd=cwd)


def output(result: subprocess.CompletedProcess) -> str:
    return f"exit code {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


# --- PromQL: the metric and label names an expression uses -------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<matchers>\{(?:"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|[^}"'])*\})
  | (?P<range>\[[^\]]*\])
  | (?P<number>(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)[a-zA-Z]*)
  | (?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<space>\s+)
  | (?P<punct>==|!=|>=|<=|=~|!~|[-+*/%^()<>,=])
    """,
    re.VERBOSE,
)
_MATCHER = re.compile(r"""([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')""")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_AGGREGATIONS = {
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
}


def parse_promql(expr: str) -> tuple[list[tuple[str, str]], set[str]]:
    """Return the selectors of *expr* as (metric name, label matchers text) and the label names
    it uses (in matchers and in by/without/on/ignoring/group_* lists)."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot read {expr[pos:]!r} in {expr!r}")
        pos = m.end()
        if m.lastgroup != "space":
            tokens.append((m.lastgroup, m.group()))
    selectors: list[tuple[str, str]] = []
    labels: set[str] = set()
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else ("", "")
        if kind == "name" and text in _LABEL_LISTS:
            if following == ("punct", "("):
                i += 2
                while tokens[i] != ("punct", ")"):
                    if tokens[i][0] == "name":
                        labels.add(tokens[i][1])
                    i += 1
        elif kind == "name" and following == ("punct", "("):
            pass  # a function or an aggregation
        elif kind == "name" and text in _AGGREGATIONS and following[1] in ("by", "without"):
            pass  # an aggregation with its grouping first: sum by (spider) (...)
        elif kind == "name" and text.lower() not in _KEYWORDS:
            matchers = following[1] if following[0] == "matchers" else ""
            selectors.append((text, matchers))
            labels.update(name for name, _, _ in _MATCHER.findall(matchers))
        i += 1
    return selectors, labels


def grafana_to_promql(expr: str) -> str:
    """Grafana's variables, replaced by what Grafana sends for them."""
    return (
        expr.replace("$__rate_interval", "1m")
        .replace("$__interval", "15s")
        .replace("$__range", "1h")
        .replace("$spider", ".*")
    )


def test_parse_promql_finds_metrics_not_functions_labels_or_durations():
    selectors, labels = parse_promql(
        'histogram_quantile(0.95, sum by (spider, le) (rate(a_bucket{spider=~"$spider", x="}"}[5m])))'
        " / on (spider) group_left (kind) max without (instance) (b offset 10m) > bool 1e3"
        " + sum by (spider) (d) + sum(e) by (le)"
        " unless c:rec[1h:1m] and 2 * inf"
    )
    assert [name for name, _ in selectors] == ["a_bucket", "b", "d", "e", "c:rec"]
    assert selectors[0][1] == '{spider=~"$spider", x="}"}'
    assert labels == {"spider", "le", "x", "kind", "instance"}


# --- Alert rules -----------------------------------------------------------------------------


def alert_blocks() -> dict[str, str]:
    """The text of each alerting rule in alerts.yml, by alert name."""
    text = ALERTS.read_text()
    parts = re.split(r"^\s*- alert:\s*", text, flags=re.M)[1:]
    return {part.split()[0]: part for part in parts}


def test_alert_rules_are_valid(promtool):
    result = run(promtool, "check", "rules", ALERTS)
    assert result.returncode == 0, output(result)
    assert f"SUCCESS: {len(ALERT_NAMES)} rules found" in result.stdout, output(result)


def test_alert_rules_have_severity_summary_with_spider_and_description():
    blocks = alert_blocks()
    assert set(blocks) == ALERT_NAMES
    for name, block in blocks.items():
        assert re.search(r"^\s+severity:\s*(warning|critical)\s*$", block, re.M), name
        # The change feed's relay serves no spider: its alerts name the sink.
        who = "sink" if name.startswith("ScraperChangefeed") else "spider"
        assert re.search(rf"^\s+summary:.*\{{\{{ \$labels\.{who} \}}\}}", block, re.M), name
        assert re.search(r"^\s+description:", block, re.M), name


def test_alert_rules_pass_their_unit_tests(promtool):
    result = run(promtool, "test", "rules", ALERTS_TEST)
    assert result.returncode == 0, output(result)
    assert "SUCCESS" in result.stdout and "FAILED" not in result.stdout + result.stderr, output(result)


def test_every_alert_is_tested_firing_and_quiet():
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in re.split(r"^\s*- eval_time:", ALERTS_TEST.read_text(), flags=re.M)[1:]:
        name = re.search(r"alertname:\s*(\S+)", case).group(1)
        if re.search(r"exp_alerts:\s*\[\]", case):
            quiet.add(name)
        else:
            fires.add(name)
            assert "exp_labels:" in case and "exp_annotations:" in case, name
    assert fires == ALERT_NAMES
    assert quiet == ALERT_NAMES


def test_alert_unit_tests_use_only_exported_metrics():
    series = re.findall(r"series:\s*'([a-zA-Z_:][a-zA-Z0-9_:]*)\{", ALERTS_TEST.read_text())
    assert series
    assert set(series) <= SERIES_NAMES


@pytest.mark.parametrize(
    "change, fails",
    [
        # a threshold off by ten: the error-rate alert no longer fires on 10 %
        (("> 0.05", "> 0.5"), "ScraperHighErrorRate"),
        # no division-by-zero guard: a spider sending no requests gets an error rate of +Inf
        (
            (
                "(sum by (spider) (rate(scraper_requests_total[5m])) > 0)",
                "sum by (spider) (rate(scraper_requests_total[5m]))",
            ),
            "ScraperHighErrorRate",
        ),
        # the "== 0" form misses a crawl whose responses series is absent
        (
            (
                "unless on (spider)\n          (sum by (spider) (increase(scraper_responses_total[10m])) > 0)",
                "and on (spider)\n          (sum by (spider) (increase(scraper_responses_total[10m])) == 0)",
            ),
            "ScraperCrawlStalled",
        ),
        # without the "open 10 minutes ago" guard a crawl that just started is reported stalled
        (
            ("(max by (spider) (scraper_spider_open offset 10m) > 0)", "(max by (spider) (scraper_spider_open) > 0)"),
            "ScraperCrawlStalled",
        ),
        # a budget of 0 means no budget
        (
            ("/ (max by (spider) (scraper_api_budget_credits) > 0)", "/ max by (spider) (scraper_api_budget_credits)"),
            "ScraperApiBudgetNearlySpent",
        ),
    ],
)
def test_unit_tests_catch_a_broken_rule(promtool, tmp_path, change, fails):
    old, new = change
    rules = ALERTS.read_text()
    assert rules.count(old) == 1, old
    (tmp_path / "alerts.yml").write_text(rules.replace(old, new))
    shutil.copy(ALERTS_TEST, tmp_path / "alerts_test.yml")
    assert run(promtool, "check", "rules", tmp_path / "alerts.yml").returncode == 0
    result = run(promtool, "test", "rules", tmp_path / "alerts_test.yml")
    assert result.returncode != 0, output(result)
    assert "FAILED" in result.stdout + result.stderr and f"alertname: {fails}" in result.stdout + result.stderr, output(
        result
    )


def test_a_rule_file_with_bad_promql_is_rejected(promtool, tmp_path):
    bad = tmp_path / "alerts.yml"
    bad.write_text(
        ALERTS.read_text().replace(
            "max by (spider) (scraper_queue_depth) > 100000", "max by (spider) (scraper_queue_depth > 100000", 1
        )
    )
    result = run(promtool, "check", "rules", bad)
    assert result.returncode != 0, output(result)
    assert "FAILED" in result.stdout + result.stderr, output(result)


# --- Prometheus configuration ----------------------------------------------------------------


def local_config(tmp_path: Path) -> Path:
    """prometheus.yml with its paths pointing into tmp_path: the rule file next to it (as in
    /etc/prometheus) and the file_sd folder in tmp_path/targets."""
    config = PROMETHEUS_CONFIG.read_text()
    assert re.search(r"^rule_files:\n  - alerts\.yml$", config, re.M)
    assert re.search(r"^  scrape_interval: 15s$", config, re.M)
    assert config.count("/etc/prometheus/targets/*.json") == 1
    (tmp_path / "targets").mkdir()
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    path = tmp_path / "prometheus.yml"
    path.write_text(config.replace("/etc/prometheus/targets/", f"{tmp_path}/targets/"))
    return path


def test_prometheus_config_is_valid(promtool, tmp_path):
    config = local_config(tmp_path)
    (tmp_path / "targets" / "worker-1-4242.json").write_text(json.dumps([{"targets": ["10.0.0.7:9410"]}]))
    result = run(promtool, "check", "config", config)
    assert result.returncode == 0, output(result)
    assert "SUCCESS: 1 rule files found" in result.stdout, output(result)
    assert f"SUCCESS: {len(ALERT_NAMES)} rules found" in result.stdout, output(result)
    # promtool only warns about a file_sd glob that matches nothing: no warning means it read ours
    assert "WARNING" not in result.stdout + result.stderr, output(result)


def test_prometheus_config_discovers_the_crawl_processes_target_files(promtool, tmp_path):
    config = local_config(tmp_path)
    # what the exporter writes: <host>-<pid>-<port>.json, written aside as .tmp then renamed
    for pid, port in ((100, 9410), (200, 9411)):
        (tmp_path / "targets" / f"worker-1-{pid}-{port}.json").write_text(
            json.dumps([{"targets": [f"10.0.0.7:{port}"], "labels": {"node": f"worker-1:{pid}"}}])
        )
    (tmp_path / "targets" / "worker-1-300-9412.tmp").write_text('[{"targets": [')
    result = run(promtool, "check", "service-discovery", "--timeout=3s", config, "scraper")
    assert result.returncode == 0, output(result)
    targets = json.loads(result.stdout)
    assert sorted(t["labels"]["instance"] for t in targets) == ["10.0.0.7:9410", "10.0.0.7:9411"]
    assert sorted(t["labels"]["node"] for t in targets) == ["worker-1:100", "worker-1:200"]
    for target in targets:
        assert target["labels"]["job"] == "scraper"
        assert target["labels"]["__scrape_interval__"] == "15s"
        assert target["labels"]["__metrics_path__"] == "/metrics"


def test_prometheus_config_rejects_a_broken_target_file(promtool, tmp_path):
    config = local_config(tmp_path)
    (tmp_path / "targets" / "worker-1-100.json").write_text(json.dumps([{"targets": "10.0.0.7:9410"}]))
    result = run(promtool, "check", "config", config)
    assert result.returncode != 0, output(result)
    assert "SD file" in result.stdout + result.stderr, output(result)


def test_prometheus_config_keeps_the_compose_alternative():
    config = PROMETHEUS_CONFIG.read_text()
    assert re.search(r"^\s*# dns_sd_configs:", config, re.M)
    assert re.search(r"^\s*#\s+- names: \[crawler\]", config, re.M)
    assert "crawler:9410" in config


# --- Grafana ---------------------------------------------------------------------------------


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels_by_row(board: dict) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    current = None
    for panel in board["panels"]:
        if panel["type"] == "row":
            current = panel["title"]
            rows[current] = list(panel.get("panels", []))  # panels of a collapsed row
        else:
            assert current is not None, f"panel {panel['title']!r} is above the first row"
            rows[current].append(panel)
    return rows


def panel_exprs(board: dict) -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panels in panels_by_row(board).values()
        for panel in panels
        for target in panel.get("targets", [])
    ]


def test_grafana_provisioning_points_at_prometheus_and_the_dashboards():
    datasources = DATASOURCES.read_text()
    assert re.search(r"^\s+type: prometheus$", datasources, re.M)
    assert re.search(r"^\s+uid: prometheus$", datasources, re.M)
    assert re.search(r"^\s+url: http://prometheus:9090$", datasources, re.M)
    providers = DASHBOARD_PROVIDERS.read_text()
    assert re.search(r"^\s+type: file$", providers, re.M)
    assert re.search(r"^\s+path: /var/lib/grafana/dashboards$", providers, re.M)


def test_dashboard_has_the_spider_variable_and_uses_the_provisioned_datasource():
    board = dashboard()
    assert 36 <= board["schemaVersion"] <= 41
    assert board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    spider = variables["spider"]
    assert spider["type"] == "query" and spider["datasource"]["uid"] == "prometheus"
    metric = re.fullmatch(r"label_values\((\w+), spider\)", spider["query"]["query"]).group(1)
    assert metric in SERIES_NAMES
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panels in panels_by_row(board).values():
        for panel in panels:
            assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}, panel["title"]
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "prometheus", panel["title"]


def test_dashboard_has_panels_for_every_layer():
    rows = panels_by_row(dashboard())
    for layer, wanted in LAYERS.items():
        assert rows.get(layer), f"no panel in the {layer} row"
        used = {
            name for panel in rows[layer] for target in panel["targets"] for name, _ in parse_promql(target["expr"])[0]
        }
        assert wanted <= used, f"{layer} row does not show {sorted(wanted - used)}"


def test_dashboard_queries_use_only_exported_metrics_and_the_spider_variable():
    exprs = panel_exprs(dashboard())
    assert len(exprs) >= 20
    for title, expr in exprs:
        selectors, labels = parse_promql(expr)
        assert selectors, f"{title}: no metric in {expr}"
        for name, matchers in selectors:
            assert name in SERIES_NAMES, f"{title}: {name} is not an exported series"
            assert 'spider=~"$spider"' in matchers, f"{title}: {name} ignores the spider variable"
        assert labels <= LABELS, f"{title}: unknown labels {sorted(labels - LABELS)}"


def test_dashboard_queries_are_valid_promql(promtool, tmp_path):
    exprs = panel_exprs(dashboard())
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": grafana_to_promql(expr)}
                    for i, (_, expr) in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(json.dumps(rules, indent=2))  # JSON is YAML
    result = run(promtool, "check", "rules", path)
    assert result.returncode == 0, output(result)
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout, output(result)
