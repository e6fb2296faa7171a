"""What the manifests expose: API keys mounted from their Secret on the
ingress's pods only and in no process environment, Ray's token authentication
on every Ray container, no pod reaching instance metadata, NetworkPolicies that
admit each port only from whom it serves, and the README's warning about
Serve's client-controlled headers."""

from __future__ import annotations

import copy
import ipaddress
import posixpath
import shutil

import pytest
import yaml

from serve_app.capacity import MARKET_TYPE_LABEL, ON_DEMAND
from serve_app.config import AppConfig, app_configs, load_serve_config
from serve_app.tools.kuberay.objects import (
    CLIENT_PORT,
    DASHBOARD_PORT,
    GCS_PORT,
    METRICS_PORT,
    RAY_AUTH_TOKEN_KEY,
    RAY_NODE_TYPE_LABEL,
    RAY_POD_LABELS,
    REDIS_PORT,
    network_policies,
)
from serve_app.tools.kuberay.render import api_key_sources, render
from serve_app.tools.kuberay.sizing import hosting_groups, node_types, replica_placements
from serve_app.tools.kuberay.spec import HEAD_GROUP, load_spec
from serve_app.topology import INGRESS_DEPLOYMENT
from tests.conftest import REPO
from tests.kuberay.schemas import load_documents

SPEC_PATH = REPO / "kuberay/cluster.yaml"
SPEC = load_spec(SPEC_PATH)
MANIFESTS = SPEC_PATH.parent / SPEC.output_dir
SERVE_CONFIG = load_serve_config((SPEC_PATH.parent / SPEC.serve_config).resolve())
APPS = app_configs(SERVE_CONFIG)
SERVE_PORT = SERVE_CONFIG["http_options"]["port"]


def committed_rayservice() -> dict:
    (service,) = load_documents(MANIFESTS / "30-rayservice.yaml")
    return service


def ray_groups(service: dict) -> dict[str, dict]:
    cluster = service["spec"]["rayClusterConfig"]
    return {HEAD_GROUP: cluster["headGroupSpec"], **{g["groupName"]: g for g in cluster["workerGroupSpecs"]}}


def env_of_container(container: dict) -> dict[str, dict]:
    return {var["name"]: var for var in container["env"]}


def env_of(group: dict) -> dict[str, dict]:
    return env_of_container(group["template"]["spec"]["containers"][0])


def ingress_groups() -> set[str]:
    nodes = node_types(committed_rayservice())
    ((name, app),) = APPS.items()
    (ingress,) = [p for p in replica_placements(app, name) if p.deployment == INGRESS_DEPLOYMENT]
    return hosting_groups(ingress, nodes)


# --- API keys -------------------------------------------------------------------


def strings_in(tree) -> set[str]:
    """Every string anywhere in a manifest tree."""
    if isinstance(tree, dict):
        return {text for value in tree.values() for text in strings_in(value)}
    if isinstance(tree, list):
        return {text for value in tree for text in strings_in(value)}
    return {tree} if isinstance(tree, str) else set()


def is_gpu_group(group: dict) -> bool:
    return "nvidia.com/gpu" in group["template"]["spec"]["containers"][0]["resources"]["limits"]


def test_prod_config_reads_api_keys_from_files():
    (app,) = APPS.values()
    assert app.ingress.api_keys and all(key.file and not key.env and not key.sha256 for key in app.ingress.api_keys)


def test_api_keys_are_mounted_from_the_secret_on_exactly_the_pods_that_can_run_the_ingress():
    (app,) = APPS.values()
    files = {posixpath.basename(key.file): posixpath.dirname(key.file) for key in app.ingress.api_keys}
    groups = ingress_groups()
    # pinned to the on-demand CPU group: never Spot, never a GPU pod, never the head (num-cpus 0)
    assert groups == {"cpu"}
    for name, group in ray_groups(committed_rayservice()).items():
        pod = group["template"]["spec"]
        mounted = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == SPEC.secrets.api_keys]
        if name not in groups:
            assert SPEC.secrets.api_keys not in strings_in(group["template"]), name
            continue
        assert group["labels"][MARKET_TYPE_LABEL] == ON_DEMAND and not is_gpu_group(group)
        mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
        found = {item["path"]: mounts[volume["name"]]["mountPath"]
                 for volume in mounted for item in volume["secret"]["items"] if mounts[volume["name"]]["readOnly"]}
        assert found == files and all(item["key"] == item["path"] for v in mounted for item in v["secret"]["items"])


def test_no_gpu_pod_template_references_the_api_key_secret():
    gpu_groups = [group for group in ray_groups(committed_rayservice()).values() if is_gpu_group(group)]
    assert gpu_groups
    for group in gpu_groups:
        assert SPEC.secrets.api_keys not in strings_in(group["template"]), group["groupName"]


def test_no_ray_container_has_the_api_key_in_its_environment():
    """So no process Ray starts (an engine beside the ingress included) inherits it."""
    for name, group in ray_groups(committed_rayservice()).items():
        container = group["template"]["spec"]["containers"][0]
        assert "envFrom" not in container, name
        assert SPEC.secrets.api_keys not in strings_in(container["env"]), name


def test_api_key_sources_follow_each_apps_ingress_and_skip_hashed_keys():
    def app(keys: list[dict], actor: dict) -> AppConfig:
        return AppConfig.model_validate({"models": [{"name": "m", "engine": {"model": "unused"}}],
                                         "ingress": {"api_keys": keys, "deployment": {"ray_actor_options": actor}}})

    nodes = node_types(committed_rayservice())
    apps = {
        "a": app([{"name": "team-a", "env": "TEAM_A_KEY"}, {"name": "ci", "sha256": "0" * 64},
                  {"name": "team-c", "file": "/keys/TEAM_C_KEY"}],
                 {"num_cpus": 1, "label_selector": {"ray.io/node-group": "cpu"}}),
        "b": app([{"name": "team-b", "env": "TEAM_B_KEY"}], {"num_cpus": 0}),
    }
    placements = [p for name, config in apps.items() for p in replica_placements(config, name)]
    envs = api_key_sources(apps, placements, nodes, "env")
    assert envs["cpu"] == ("TEAM_A_KEY", "TEAM_B_KEY")
    assert envs[HEAD_GROUP] == ("TEAM_B_KEY",)  # a 0-CPU ingress fits the head
    assert all("TEAM_A_KEY" not in names for group, names in envs.items() if group != "cpu")
    assert api_key_sources(apps, placements, nodes, "file") == {"cpu": ("/keys/TEAM_C_KEY",)}


def test_an_api_key_variable_where_an_engine_can_run_is_refused(tmp_path):
    """The tiny tier shares the ingress's CPU pods: a variable there would reach its engine."""
    shutil.copytree(REPO / "kuberay", tmp_path / "kuberay")
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    prod = tmp_path / "configs/prod.yaml"
    config = load_serve_config(prod)
    for key in config["applications"][0]["args"]["ingress"]["api_keys"]:
        key["env"] = posixpath.basename(key.pop("file"))
    prod.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match=r"cpu: .*smollm2.* would inherit the API-key variables SERVE_APP_API_KEY"):
        render(tmp_path / "kuberay/cluster.yaml")


# --- Ray token authentication --------------------------------------------------------


def test_every_ray_container_authenticates_with_the_token_from_its_secret():
    cluster = committed_rayservice()["spec"]["rayClusterConfig"]
    # KubeRay reads the same Secret for its dashboard calls and gives it to the containers it adds
    assert cluster["authOptions"] == {"mode": "token", "secretName": SPEC.secrets.ray_auth_token}
    for name, group in ray_groups(committed_rayservice()).items():
        for container in group["template"]["spec"]["containers"]:
            env = env_of_container(container)
            assert env["RAY_AUTH_MODE"] == {"name": "RAY_AUTH_MODE", "value": "token"}, name
            assert env["RAY_AUTH_TOKEN"] == {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": SPEC.secrets.ray_auth_token, "key": RAY_AUTH_TOKEN_KEY, "optional": False}}}, name
            assert "RAY_AUTH_TOKEN_PATH" not in env, name


# --- Instance metadata -------------------------------------------------------------------


def test_no_pod_reaches_instance_metadata():
    """Hop limit 1 and IMDSv2 only: answers stop at the node, so no pod can take its IAM role."""
    classes = [d for d in load_documents(MANIFESTS / "10-karpenter.yaml") if d["kind"] == "EC2NodeClass"]
    assert classes
    for node_class in classes:
        options = node_class["spec"]["metadataOptions"]
        assert options["httpPutResponseHopLimit"] == 1 and options["httpTokens"] == "required", options


def test_prod_replicas_do_not_poll_imds_and_spot_pods_drain_within_their_grace_period():
    (app,) = APPS.values()
    assert not app.preemption.imds
    spot = SPEC.spot
    assert spot.drain_timeout_s + spot.teardown_margin_s <= spot.termination_grace_period_s <= spot.notice_s
    for name, group in ray_groups(committed_rayservice()).items():
        if name == HEAD_GROUP:
            continue
        env = env_of(group)
        assert env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"]["value"] == str(spot.drain_timeout_s), name
        assert group["template"]["spec"]["terminationGracePeriodSeconds"] == spot.termination_grace_period_s


# --- NetworkPolicies -------------------------------------------------------------------

OPERATOR = {"kubernetes.io/metadata.name": SPEC.network.kuberay_operator_namespace}
MONITORING = {"kubernetes.io/metadata.name": SPEC.network.monitoring_namespace}


def committed_policies() -> list[dict]:
    return load_documents(MANIFESTS / "05-network-policies.yaml")


def pod_labels() -> dict[str, dict[str, str]]:
    """Each pod's labels as it runs: its template's plus those KubeRay adds."""
    pods = {}
    for name, group in ray_groups(committed_rayservice()).items():
        node_type = "head" if name == HEAD_GROUP else "worker"
        pods[name] = {**group["template"]["metadata"]["labels"], **RAY_POD_LABELS, RAY_NODE_TYPE_LABEL: node_type}
    (redis,) = [d for d in load_documents(MANIFESTS / "20-redis.yaml") if d["kind"] == "Deployment"]
    pods["redis"] = redis["spec"]["template"]["metadata"]["labels"]
    return pods


def selects(selector: dict, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector
    return selector.get("matchLabels", {}).items() <= labels.items()


def admits(policies: list[dict], labels: dict[str, str], port: int, source: dict) -> bool:
    """Whether a connection from `source` ({"pod": labels} in the namespace,
    {"namespace": labels} or {"ip": address}) to the pod's port is allowed."""
    chosen = [p for p in policies if selects(p["spec"]["podSelector"], labels)]
    if not chosen:
        return True  # no policy selects the pod: Kubernetes admits everything
    for policy in chosen:
        for rule in policy["spec"].get("ingress", []):
            if "ports" in rule and port not in {p["port"] for p in rule["ports"]}:
                continue
            for peer in rule.get("from", [{}]):
                if not peer:
                    return True
                if "podSelector" in peer and "pod" in source and selects(peer["podSelector"], source["pod"]):
                    return True
                if "namespaceSelector" in peer and "namespace" in source and selects(
                        peer["namespaceSelector"], source["namespace"]):
                    return True
                if "ipBlock" in peer and "ip" in source and ipaddress.ip_address(source["ip"]) in ipaddress.ip_network(
                        peer["ipBlock"]["cidr"]):
                    return True
    return False


def test_policies_are_what_the_generator_writes_for_the_spec():
    assert committed_policies() == network_policies(SPEC, SERVE_PORT)


def test_every_pod_is_selected_by_a_policy():
    policies = committed_policies()
    for name, labels in pod_labels().items():
        assert any(selects(p["spec"]["podSelector"], labels) for p in policies), name


def test_the_heads_ray_ports_admit_only_ray_pods_and_the_operator_the_dashboard():
    policies, pods = committed_policies(), pod_labels()
    head, worker = pods[HEAD_GROUP], pods["cpu"]
    other_pod = {"app.kubernetes.io/name": "something-else"}
    for port in (DASHBOARD_PORT, GCS_PORT, CLIENT_PORT):
        assert admits(policies, head, port, {"pod": worker})
        assert not admits(policies, head, port, {"pod": other_pod})
        assert not admits(policies, head, port, {"pod": pods["redis"]})
        assert not admits(policies, head, port, {"ip": "10.0.3.4"})
        assert not admits(policies, head, port, {"namespace": MONITORING})
    assert admits(policies, head, DASHBOARD_PORT, {"namespace": OPERATOR})
    assert not admits(policies, head, GCS_PORT, {"namespace": OPERATOR})
    assert not admits(policies, worker, DASHBOARD_PORT, {"namespace": OPERATOR})


def test_the_serve_port_admits_the_nlb_on_workers_and_metrics_admit_monitoring():
    policies, pods = committed_policies(), pod_labels()
    inside, outside = str(SPEC.network.serve_client_cidrs[0][5]), "203.0.113.9"
    for name, labels in pods.items():
        if name in ("redis", HEAD_GROUP):
            continue
        assert admits(policies, labels, SERVE_PORT, {"ip": inside}), name
        assert not admits(policies, labels, SERVE_PORT, {"ip": outside}), name
        assert admits(policies, labels, METRICS_PORT, {"namespace": MONITORING}), name
        assert not admits(policies, labels, METRICS_PORT, {"ip": inside}), name
    assert not admits(policies, pods[HEAD_GROUP], SERVE_PORT, {"ip": inside})
    assert admits(policies, pods[HEAD_GROUP], METRICS_PORT, {"namespace": MONITORING})


def test_redis_admits_only_ray_pods():
    policies, pods = committed_policies(), pod_labels()
    assert admits(policies, pods["redis"], REDIS_PORT, {"pod": pods[HEAD_GROUP]})
    assert not admits(policies, pods["redis"], REDIS_PORT, {"pod": {"app.kubernetes.io/name": "x"}})
    assert not admits(policies, pods["redis"], REDIS_PORT, {"ip": "10.0.3.4"})


def test_the_check_fails_without_the_dashboard_policy():
    policies = [p for p in committed_policies() if not p["metadata"]["name"].endswith("-ray-dashboard")]
    assert not admits(policies, pod_labels()[HEAD_GROUP], DASHBOARD_PORT, {"namespace": OPERATOR})
    opened = copy.deepcopy(committed_policies())
    opened[0]["spec"]["ingress"].append({})  # an empty rule admits everyone
    assert admits(opened, pod_labels()[HEAD_GROUP], GCS_PORT, {"ip": "203.0.113.9"})


def test_dashboard_host_is_set_and_guarded():
    head = committed_rayservice()["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert ports["dashboard"] == DASHBOARD_PORT and ports["serve"] == SERVE_PORT


@pytest.mark.parametrize("header", ["x-request-disconnect-disabled", "x-request-timeout-seconds"])
def test_readme_says_to_strip_serves_client_controlled_headers(header):
    readme = (REPO / "kuberay/README.md").read_text()
    assert header in readme and "NLB" in readme
