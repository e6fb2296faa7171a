"""The generator: placements from the app's Topology (checked against what Ray's
own builder makes of the app), groups that host them, sizes, drift, and the
properties a first apply on EKS depends on."""

from __future__ import annotations

import re
import shutil
from collections import Counter

import pytest
import yaml
from pydantic import ValidationError
from ray.serve.schema import ServeDeploySchema

from serve_app.app import build_from_config
from serve_app.capacity import MARKET_TYPE_LABEL
from serve_app.config import AppConfig, app_configs, load_serve_config
from serve_app.tools.kuberay.objects import SPOT_TAINT, rayservice
from serve_app.tools.kuberay.render import drift, main, render
from serve_app.tools.kuberay.sizing import (
    Demand,
    NodeType,
    ReplicaPlacement,
    group_sizes,
    hosts,
    node_types,
    placement,
    replica_placements,
    selector_matches,
    spot_drain_problems,
    unplaceable,
)
from serve_app.tools.kuberay.spec import ClusterSpec, SpotTiming, load_spec
from tests.conftest import REPO
from tests.kuberay.schemas import load_documents

SPEC_PATH = REPO / "kuberay/cluster.yaml"
SPEC = load_spec(SPEC_PATH)
MANIFESTS = SPEC_PATH.parent / SPEC.output_dir
SERVE_CONFIG = (SPEC_PATH.parent / SPEC.serve_config).resolve()


def committed(name: str) -> list[dict]:
    return load_documents(MANIFESTS / name)


def committed_rayservice() -> dict:
    (service,) = committed("30-rayservice.yaml")
    return service


def prod_placements() -> list[ReplicaPlacement]:
    apps = app_configs(load_serve_config(SERVE_CONFIG))
    return [p for name, app in apps.items() for p in replica_placements(app, name)]


def app_with(deployment: dict) -> AppConfig:
    return AppConfig.model_validate({"models": [{"name": "m", "engine": {"model": "unused"}, "deployment": deployment}]})


def spec_nodes(spec: ClusterSpec = SPEC) -> list[NodeType]:
    return node_types(rayservice(spec))


def llm_placements(app: AppConfig) -> list[ReplicaPlacement]:
    return [p for p in replica_placements(app) if p.deployment.startswith("LLMServer")]


def as_ray_builds(config: AppConfig, app: str = "default") -> list[ReplicaPlacement]:
    """Test oracle: the placements of the deployments Ray's own builder makes of
    `build_from_config(config)`, as `serve run` deploys them (private Ray API)."""
    from ray.serve._private.build_app import build_app

    placements = []
    for deployment in build_app(build_from_config(config), name=app).deployments:
        replica, deployment_config = deployment._replica_config, deployment._deployment_config
        bundles = replica.placement_group_bundles
        if bundles:
            selectors = replica.placement_group_bundle_label_selector or [{}] * len(bundles)
            demands = [Demand({k: float(v) for k, v in b.items() if v}, dict(s))
                       for b, s in zip(bundles, selectors, strict=True)]
            if replica.placement_group_strategy == "STRICT_PACK":
                total: Counter[str] = Counter()
                for demand in demands:
                    total.update(demand.resources)
                demands = [Demand(dict(total), {k: v for d in demands for k, v in d.selector.items()})]
            fallbacks: list[dict] = []
        else:
            actor = replica.ray_actor_options
            demands = [Demand({k: float(v) for k, v in replica.resource_dict.items() if v},
                              dict(actor.get("label_selector") or {}))]
            fallbacks = [dict(entry.get("label_selector") or {}) for entry in actor.get("fallback_strategy") or []]
        scaling = deployment_config.autoscaling_config
        low, high = (scaling.min_replicas, scaling.max_replicas) if scaling else (deployment_config.num_replicas,) * 2
        placements.append(ReplicaPlacement(app, deployment.name, tuple(demands), tuple(fallbacks), low, high,
                                           deployment_config.graceful_shutdown_timeout_s))
    return sorted(placements, key=lambda p: p.deployment)


def pod_templates(service: dict) -> list[tuple[dict, dict]]:
    cluster = service["spec"]["rayClusterConfig"]
    return [(cluster["headGroupSpec"], cluster["headGroupSpec"]["template"])] + [
        (group, group["template"]) for group in cluster["workerGroupSpecs"]
    ]


# --- drift and the CLI --------------------------------------------------------


def test_committed_manifests_are_what_the_generator_writes():
    assert drift(render(SPEC_PATH)) == []


def test_check_fails_on_an_edited_or_stale_file(tmp_path, capsys):
    spec = yaml.safe_load(SPEC_PATH.read_text())
    spec["serve_config"] = str(SERVE_CONFIG)
    spec_path = tmp_path / "cluster.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    assert main(["--spec", str(spec_path)]) == 0
    assert main(["--spec", str(spec_path), "--check"]) == 0
    rayservice_file = tmp_path / "manifests" / "30-rayservice.yaml"
    rayservice_file.write_text(rayservice_file.read_text() + "# edited by hand\n")
    (tmp_path / "manifests" / "99-old.yaml").write_text("kind: ConfigMap\n")
    capsys.readouterr()
    assert main(["--spec", str(spec_path), "--check"]) == 1
    errors = capsys.readouterr().err
    assert "30-rayservice.yaml: differs" in errors and "99-old.yaml: no longer generated" in errors
    assert main(["--spec", str(spec_path)]) == 0
    assert not (tmp_path / "manifests" / "99-old.yaml").exists()


def test_generator_refuses_a_config_no_group_can_host(tmp_path, capsys):
    serve_config = load_serve_config(SERVE_CONFIG)
    options = serve_config["applications"][0]["args"]["models"][0]["deployment"]
    options["ray_actor_options"] = {"num_cpus": 4, "num_gpus": 16}
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(serve_config))
    spec = {**yaml.safe_load(SPEC_PATH.read_text()), "serve_config": str(tmp_path / "serve.yaml")}
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(spec))
    assert main(["--spec", str(tmp_path / "cluster.yaml")]) == 1
    assert "'GPU': 16.0" in capsys.readouterr().err
    assert not (tmp_path / "manifests").exists()


# --- serveConfigV2 is the Serve config ------------------------------------------


def test_serve_config_v2_is_what_serve_run_deploys():
    embedded = yaml.safe_load(committed_rayservice()["spec"]["serveConfigV2"])
    source = load_serve_config(SERVE_CONFIG)
    assert embedded == source
    assert ServeDeploySchema.model_validate(embedded) == ServeDeploySchema.model_validate(source)
    for name, app in app_configs(embedded).items():
        assert sorted(replica_placements(app, name), key=lambda p: p.deployment) == as_ray_builds(app, name)


@pytest.mark.parametrize("deployment", [
    {"num_replicas": 2},  # no ray_actor_options: Serve's default num_cpus, and its graceful shutdown timeout
    {"autoscaling_config": {"max_replicas": 3}, "ray_actor_options": {"num_gpus": 1, "memory": 2**30,
                                                                      "resources": {"custom": 2}}},
    {"num_replicas": 1, "placement_group_bundles": [{"CPU": 1}, {"GPU": 1}, {"GPU": 1}],
     "placement_group_strategy": "PACK", "ray_actor_options": {"num_cpus": 1}},
])
def test_placements_from_the_topology_are_what_ray_builds(deployment):
    app = app_with(deployment)
    assert sorted(replica_placements(app), key=lambda p: p.deployment) == as_ray_builds(app)


def test_the_oracle_sees_a_difference():
    ours = sorted(replica_placements(app_with({"num_replicas": 2})), key=lambda p: p.deployment)
    theirs = as_ray_builds(app_with({"num_replicas": 3}))
    assert ours != theirs


# --- what replicas need vs what groups offer ------------------------------------


def test_every_prod_replica_has_a_worker_group():
    placements = prod_placements()
    assert placements and unplaceable(placements, node_types(committed_rayservice())) == []


def test_group_sizes_hold_every_deployment_at_min_and_at_max():
    """Resource totals, independent of the packing: the groups at their min (max)
    offer at least what all deployments at their min (max) ask for."""
    placements = prod_placements()
    cluster = committed_rayservice()["spec"]["rayClusterConfig"]
    offered = {node.group: node.resources for node in node_types(committed_rayservice())}
    for bound, pods_key in (("min_replicas", "minReplicas"), ("max_replicas", "maxReplicas")):
        for resource in ("CPU", "GPU"):
            asked = sum(getattr(p, bound) * d.resources.get(resource, 0) for p in placements for d in p.demands)
            given = sum(g[pods_key] * offered[g["groupName"]].get(resource, 0) for g in cluster["workerGroupSpecs"])
            assert given >= asked, (bound, resource)


def test_a_replica_no_group_can_host_is_reported():
    wrong_label = app_with({"num_replicas": 1, "ray_actor_options": {
        "num_cpus": 1, "num_gpus": 1, "label_selector": {MARKET_TYPE_LABEL: "reserved"}}})
    too_big = app_with({"num_replicas": 1, "ray_actor_options": {"num_cpus": 4, "num_gpus": 16}})
    for app in (wrong_label, too_big):
        problems = unplaceable(replica_placements(app), spec_nodes())
        assert len(problems) == 1 and problems[0].startswith("LLMServer-m-default:"), problems


def test_a_fallback_no_group_can_host_is_reported():
    app = app_with({"num_replicas": 1, "ray_actor_options": {
        "num_cpus": 1, "num_gpus": 1, "label_selector": {MARKET_TYPE_LABEL: "spot"},
        "fallback_strategy": [{"label_selector": {MARKET_TYPE_LABEL: "reserved"}}]}})
    problems = unplaceable(replica_placements(app), spec_nodes())
    assert len(problems) == 1 and "fallback" in problems[0]


def strict_pack_placement(selector: dict[str, str]) -> ReplicaPlacement:
    return placement("default", "tp4", {
        "num_replicas": 2, "ray_actor_options": {"num_cpus": 2},
        "placement_group_bundles": [{"CPU": 2}] + [{"GPU": 1}] * 4, "placement_group_strategy": "STRICT_PACK",
        "placement_group_bundle_label_selector": [selector],
    })


def test_strict_pack_bundles_need_one_pod_with_all_their_gpus():
    tp4 = strict_pack_placement({MARKET_TYPE_LABEL: "spot"})
    (demand,) = tp4.demands
    assert demand.resources == {"CPU": 2.0, "GPU": 4.0}
    nodes = spec_nodes()
    able = [node.group for node in hosts(demand, nodes)]
    assert able == [g.name for g in SPEC.groups if g.gpus >= 4 and SPEC.pool(g.node_pool).capacity_type == "spot"]
    sizes = group_sizes([tp4], nodes)
    assert sizes[able[0]] == (2, 2)  # one 4-GPU replica per pod
    without = SPEC.model_copy(update={"groups": [g for g in SPEC.groups if g.name not in able]})
    assert unplaceable([tp4], spec_nodes(without))


def test_spot_pinned_replicas_count_on_spot_and_their_fallback_on_on_demand():
    app = app_with({"autoscaling_config": {"min_replicas": 1, "max_replicas": 3}, "ray_actor_options": {
        "num_cpus": 4, "num_gpus": 1, "label_selector": {MARKET_TYPE_LABEL: "spot"},
        "fallback_strategy": [{"label_selector": {MARKET_TYPE_LABEL: "on-demand"}}]}})
    sizes = group_sizes(llm_placements(app), spec_nodes())
    # 1-GPU pods hold one replica each; the fallback may take all of them at max.
    assert sizes["gpu-spot"] == (1, 3)
    assert sizes["gpu-ondemand"] == (0, 3)
    assert sizes["gpu-spot-x4"] == sizes["gpu-ondemand-x4"] == (0, 0)


def test_small_replicas_share_a_pod():
    node = NodeType("g", {"CPU": 7.0}, {})
    small = llm_placements(app_with({"num_replicas": 3, "ray_actor_options": {"num_cpus": 2}}))
    assert group_sizes(small, [node]) == {"g": (1, 1)}  # 3 x 2 CPUs in 7
    bigger = llm_placements(app_with({"num_replicas": 3, "ray_actor_options": {"num_cpus": 4}}))
    assert group_sizes(bigger, [node]) == {"g": (3, 3)}


@pytest.mark.parametrize("selector, labels, expected", [
    ({MARKET_TYPE_LABEL: "spot"}, {MARKET_TYPE_LABEL: "spot"}, True),
    ({MARKET_TYPE_LABEL: "spot"}, {MARKET_TYPE_LABEL: "on-demand"}, False),
    ({MARKET_TYPE_LABEL: "spot"}, {}, False),
    ({MARKET_TYPE_LABEL: "!spot"}, {MARKET_TYPE_LABEL: "on-demand"}, True),
    ({MARKET_TYPE_LABEL: "!spot"}, {}, True),
    ({MARKET_TYPE_LABEL: "in(spot, on-demand)"}, {MARKET_TYPE_LABEL: "on-demand"}, True),
    ({MARKET_TYPE_LABEL: "!in(spot,on-demand)"}, {MARKET_TYPE_LABEL: "spot"}, False),
])
def test_label_selector_semantics(selector, labels, expected):
    assert selector_matches(selector, labels) is expected
    assert bool(hosts(Demand({}, selector), [NodeType("g", {}, labels)])) is expected


# --- Spot timing ------------------------------------------------------------------


def test_spot_groups_drain_within_the_notice():
    spot_groups = [g for g, _ in pod_templates(committed_rayservice())[1:] if g["labels"][MARKET_TYPE_LABEL] == "spot"]
    assert spot_groups
    for group in spot_groups:
        pod = group["template"]["spec"]
        assert pod["nodeSelector"]["karpenter.sh/capacity-type"] == "spot"
        assert {"key": SPOT_TAINT["key"], "operator": "Exists", "effect": SPOT_TAINT["effect"]} in pod["tolerations"]
        env = {var["name"]: var.get("value") for var in pod["containers"][0]["env"]}
        drain = float(env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"])
        assert drain + SPEC.spot.teardown_margin_s <= pod["terminationGracePeriodSeconds"] <= SPEC.spot.notice_s
    assert spot_drain_problems(prod_placements(), node_types(committed_rayservice()), SPEC.spot.drain_timeout_s) == []


def test_a_spot_replica_slower_than_the_drain_is_reported():
    app = app_with({"num_replicas": 1, "graceful_shutdown_timeout_s": 300, "ray_actor_options": {
        "num_cpus": 1, "num_gpus": 1, "label_selector": {MARKET_TYPE_LABEL: "spot"}}})
    problems = spot_drain_problems(replica_placements(app), spec_nodes(), SPEC.spot.drain_timeout_s)
    assert len(problems) == 1 and "300" in problems[0]


def test_spot_timing_must_fit_the_notice():
    with pytest.raises(ValidationError):
        SpotTiming(notice_s=120, termination_grace_period_s=120, drain_timeout_s=115, teardown_margin_s=10)


# --- what a first apply depends on ---------------------------------------------------


def test_head_schedules_nothing_on_demand_and_the_cluster_autoscales_with_gcs_ft():
    spec = committed_rayservice()["spec"]
    cluster = spec["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head["labels"][MARKET_TYPE_LABEL] == "on-demand"
    assert head["template"]["spec"]["nodeSelector"]["karpenter.sh/capacity-type"] == "on-demand"
    assert cluster["enableInTreeAutoscaling"] is True and cluster["autoscalerOptions"]["version"] == "v2"
    assert cluster["gcsFaultToleranceOptions"]["redisPassword"]["valueFrom"]["secretKeyRef"]
    assert spec["upgradeStrategy"]["type"] == "NewCluster"
    assert cluster["rayVersion"] == __import__("ray").__version__
    assert {g["groupName"] for g in cluster["workerGroupSpecs"]} >= {"cpu", "gpu-ondemand", "gpu-spot"}


def test_ray_labels_match_the_node_capacity_type_and_groups_spread_over_zones():
    for group, template in pod_templates(committed_rayservice()):
        pod = template["spec"]
        assert group["labels"][MARKET_TYPE_LABEL] == pod["nodeSelector"]["karpenter.sh/capacity-type"]
        if "groupName" in group:
            (spread,) = pod["topologySpreadConstraints"]
            assert spread["topologyKey"] == "topology.kubernetes.io/zone"
            assert spread["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()


def all_pod_templates() -> list[dict]:
    templates = [t for _, t in pod_templates(committed_rayservice())]
    redis = [d for d in committed("20-redis.yaml") if d["kind"] == "Deployment"]
    return templates + [d["spec"]["template"] for d in redis]


@pytest.mark.parametrize("template", all_pod_templates(), ids=lambda t: t["metadata"]["labels"]["app.kubernetes.io/component"])
def test_pods_can_schedule_on_their_node_pools(template):
    pools = {p["metadata"]["name"]: p["spec"]["template"]["spec"] for p in committed("10-karpenter.yaml")
             if p["kind"] == "NodePool"}
    pod = template["spec"]
    pool = pools[pod["nodeSelector"]["karpenter.sh/nodepool"]]
    allowed = {r["key"]: r["values"] for r in pool["requirements"]}
    assert pod["nodeSelector"]["karpenter.sh/capacity-type"] in allowed["karpenter.sh/capacity-type"]
    tolerated = {(t["key"], t["effect"]) for t in pod.get("tolerations", [])}
    assert {(t["key"], t["effect"]) for t in pool.get("taints", [])} <= tolerated
    requests = pod["containers"][0]["resources"]["requests"]
    need_cpu = float(str(requests["cpu"]).rstrip("m")) / (1000 if str(requests["cpu"]).endswith("m") else 1)
    need_gib = float(requests["memory"].removesuffix("Gi"))
    need_gpus = int(requests.get("nvidia.com/gpu", 0))
    reserve = SPEC.node_reserved
    assert any(
        need_cpu <= SPEC.instance_types[t].cpu - reserve.cpu
        and need_gib <= SPEC.instance_types[t].memory_gib - reserve.memory_gib
        and need_gpus <= SPEC.instance_types[t].gpus
        for t in allowed["node.kubernetes.io/instance-type"]
    )


def test_gpu_pool_limits_leave_room_for_an_upgrade_cluster():
    groups = committed_rayservice()["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    for pool in (p for p in committed("10-karpenter.yaml") if p["kind"] == "NodePool"):
        gpus = sum(g["maxReplicas"] * int(g["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0))
                   for g in groups if g["template"]["spec"]["nodeSelector"]["karpenter.sh/nodepool"] == pool["metadata"]["name"])
        if "limits" in pool["spec"]:
            assert int(pool["spec"]["limits"]["nvidia.com/gpu"]) >= 2 * gpus


def test_gcs_redis_is_the_redis_of_the_manifests_and_no_secret_value_is_in_git():
    service, deployment = committed("20-redis.yaml")
    gcs = committed_rayservice()["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    assert gcs["redisAddress"] == f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    (password,) = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert password["valueFrom"]["secretKeyRef"]["name"] == gcs["redisPassword"]["valueFrom"]["secretKeyRef"]["name"]
    text = "\n".join(path.read_text() for path in MANIFESTS.glob("*.yaml"))
    assert "kind: Secret" not in text
    for template in all_pod_templates():
        for var in template["spec"]["containers"][0].get("env", []):
            assert "value" not in var or not re.search("PASSWORD|TOKEN|KEY", var["name"]), var


def test_every_worker_group_has_a_disruption_budget():
    budgets = committed("40-pdb.yaml")
    for group in committed_rayservice()["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        labels = group["template"]["metadata"]["labels"]
        matching = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(matching) == 1 and matching[0]["spec"]["maxUnavailable"] == 1


def test_cluster_spec_refuses_a_pod_larger_than_its_instances():
    raw = yaml.safe_load(SPEC_PATH.read_text())
    raw["groups"][0]["cpu"] = 500
    with pytest.raises(ValidationError, match="fits no instance type"):
        ClusterSpec.model_validate(raw)


def test_dockerfile_builds_the_images_on_the_clusters_ray():
    dockerfile = (REPO / "kuberay/Dockerfile").read_text()
    (base,) = re.findall(r"^ARG BASE_TAG=(\S+)$", dockerfile, re.M)
    assert base.split("-")[0] == committed_rayservice()["spec"]["rayClusterConfig"]["rayVersion"]
    assert "py311" in base and "FROM rayproject/ray:${BASE_TAG}" in dockerfile
    assert SPEC.images.gpu != SPEC.images.cpu


def test_spec_copies_cleanly(tmp_path):
    """The spec's paths are relative to its folder, so the kuberay/ folder moves as a unit."""
    shutil.copytree(REPO / "kuberay", tmp_path / "kuberay")
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    assert drift(render(tmp_path / "kuberay/cluster.yaml")) == []
