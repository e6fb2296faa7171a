"""The Grafana dashboard reads only documented metrics and labels; the scrape
config finds the Ray pods the manifests run."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from serve_app.tools.kuberay.objects import METRICS_PORT
from serve_app.tools.kuberay.spec import load_spec
from tests.conftest import REPO
from tests.kuberay.schemas import load_documents

MONITORING = REPO / "monitoring"
CATALOG = yaml.safe_load((MONITORING / "metrics.yaml").read_text())
DASHBOARD = json.loads((MONITORING / "grafana-dashboard.json").read_text())
SCRAPE = yaml.safe_load((MONITORING / "prometheus.yaml").read_text())
SPEC = load_spec(REPO / "kuberay/cluster.yaml")

METRIC = re.compile(r"\bray_[a-zA-Z0-9_]+")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"\{([^}]*)\}")
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def exported() -> dict[str, dict]:
    """Every exported series name -> its catalog entry."""
    names = {}
    for entry in CATALOG["app"]:
        names[CATALOG["export_prefix"] + entry["name"]] = entry
    for entry in CATALOG["ray"]:
        names[entry["name"]] = entry
    for name, entry in list(names.items()):
        if entry["type"] == "histogram":
            names.update({name + suffix: entry for suffix in HISTOGRAM_SERIES})
            del names[name]  # a histogram is only read through its series
    return names


def targets() -> list[tuple[str, dict]]:
    return [(panel["title"], target) for panel in DASHBOARD["panels"] for target in panel.get("targets", [])]


def test_catalog_entries_are_well_formed():
    for entry in CATALOG["app"]:
        assert entry["name"].startswith("serve_app_") and entry["help"]
        assert entry["type"] in {"counter", "gauge", "histogram"}
        assert entry["name"].endswith("_total") == (entry["type"] == "counter"), entry["name"]
    names = [e["name"] for e in CATALOG["app"] + CATALOG["ray"]]
    assert len(set(names)) == len(names)


def test_every_panel_has_a_promql_query_on_the_prometheus_datasource():
    assert DASHBOARD["panels"]
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(set(ids)) == len(ids)
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in DASHBOARD["panels"]:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert target["expr"].strip() and target["expr"].count("(") == target["expr"].count(")")


@pytest.mark.parametrize("title, target", targets(), ids=lambda v: v if isinstance(v, str) else v["refId"])
def test_queries_use_documented_metrics_and_labels(title, target):
    known = exported()
    expr = target["expr"]
    used = METRIC.findall(expr)
    assert used, "no metric in the query"
    unknown = [name for name in used if name not in known]
    assert not unknown, f"not in monitoring/metrics.yaml: {unknown}"
    labels = set(CATALOG["scrape_labels"])
    for name in used:
        labels |= set(known[name]["labels"]) | ({"le"} if name.endswith("_bucket") else set())
    named = [label.strip() for group in GROUPING.findall(expr) for label in group.split(",") if label.strip()]
    named += [m.split("=")[0].strip(" !~") for group in MATCHERS.findall(expr) for m in group.split(",") if m.strip()]
    assert set(named) <= labels, f"labels not on these metrics: {set(named) - labels}"
    for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")):
        assert label in named, f"legend uses {label}, which the query does not keep"


def test_counters_are_read_as_rates_and_histograms_by_quantile():
    known = exported()
    for _, target in targets():
        expr = target["expr"]
        for match in METRIC.finditer(expr):
            entry, before = known[match.group()], expr[:match.start()]
            if entry["type"] == "counter":
                assert re.search(r"(rate|increase)\($", before), f"{match.group()} outside rate/increase"
            if entry["type"] == "histogram":
                assert "histogram_quantile(" in before, f"{match.group()} outside histogram_quantile"


def test_dashboard_covers_the_issue():
    text = " ".join(target["expr"] for _, target in targets())
    for needed in ("requests_total", "request_latency_seconds_bucket", "ttft_seconds_bucket",
                   "queue_wait_seconds_bucket", "replicas", "cost_per_1k_requests_usd", "preemptions_total"):
        assert "ray_serve_app_" + needed in text
    quantiles = re.findall(r"histogram_quantile\((0\.\d+),[^;]*?by \(le, pool\)", text)
    assert {"0.5", "0.99"} <= set(quantiles)


def test_scrape_config_finds_the_ray_pods_metrics_port():
    (job,) = SCRAPE["scrape_configs"]
    (discovery,) = job["kubernetes_sd_configs"]
    assert discovery["role"] == "pod" and discovery["namespaces"]["names"] == [SPEC.namespace]
    keep = {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}
    assert keep[("__meta_kubernetes_pod_container_port_name",)] == "metrics"
    assert keep[("__meta_kubernetes_pod_label_ray_io_is_ray_node",)] == "yes"
    added = {r["target_label"] for r in job["relabel_configs"] if "target_label" in r}
    assert added == set(CATALOG["scrape_labels"])
    (service,) = load_documents(REPO / "kuberay" / SPEC.output_dir / "30-rayservice.yaml")
    cluster = service["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        ports = {p["name"]: p["containerPort"] for p in group["template"]["spec"]["containers"][0]["ports"]}
        assert ports["metrics"] == int(group["rayStartParams"]["metrics-export-port"]) == METRICS_PORT
