"""Every generated manifest validates, and a misspelt field fails each validator."""

from __future__ import annotations

import copy

import pytest

from serve_app.tools.kuberay.render import load_spec
from tests.conftest import REPO
from tests.kuberay.schemas import (
    CRD_DIR,
    core_errors,
    crd_errors,
    karpenter_errors,
    kuberay_rules,
    load_documents,
    pod_template_object,
)

SPEC = load_spec(REPO / "kuberay/cluster.yaml")
MANIFESTS = REPO / "kuberay" / SPEC.output_dir
needs_crds = pytest.mark.skipif(not CRD_DIR.is_dir(), reason=f"KubeRay CRDs not found in {CRD_DIR}")


def documents() -> list[dict]:
    return [doc for path in sorted(MANIFESTS.glob("*.yaml")) for doc in load_documents(path)]


def by_kind(kind: str) -> list[dict]:
    return [doc for doc in documents() if doc["kind"] == kind]


def the_rayservice() -> dict:
    (service,) = by_kind("RayService")
    return service


def ray_pod_templates(rayservice: dict) -> list[tuple[str, dict]]:
    cluster = rayservice["spec"]["rayClusterConfig"]
    return [("headgroup", cluster["headGroupSpec"]["template"])] + [
        (group["groupName"], group["template"]) for group in cluster["workerGroupSpecs"]
    ]


def test_every_manifest_has_a_validator():
    kinds = {doc["kind"] for doc in documents()}
    assert kinds == {"Namespace", "EC2NodeClass", "NodePool", "Service", "Deployment", "RayService",
                     "PodDisruptionBudget"}


@needs_crds
def test_rayservice_matches_the_kuberay_crd():
    assert crd_errors(the_rayservice(), "ray.io_rayservices.yaml") == []


@needs_crds
def test_embedded_cluster_spec_matches_the_raycluster_crd():
    service = the_rayservice()
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": service["metadata"]["name"]},
               "spec": service["spec"]["rayClusterConfig"]}
    assert crd_errors(cluster, "ray.io_rayclusters.yaml") == []


@needs_crds
@pytest.mark.parametrize("path, typo", [
    (("spec", "rayClusterConfig", "workerGroupSpecs", 0), "minReplica"),
    (("spec", "rayClusterConfig", "headGroupSpec", "template", "spec"), "terminationGracePeriodSecond"),
    (("spec", "upgradeStrategy"), "typ"),
])
def test_a_misspelt_field_fails_the_crd(path, typo):
    service = copy.deepcopy(the_rayservice())
    node = service
    for key in path:
        node = node[key]
    node[typo] = 1
    errors = crd_errors(service, "ray.io_rayservices.yaml")
    assert any(typo in error for error in errors), errors


def test_rayservice_passes_kuberay_admission_rules():
    assert kuberay_rules(the_rayservice()) == []


def test_kuberay_rules_catch_labels_in_ray_start_params():
    service = copy.deepcopy(the_rayservice())
    service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["rayStartParams"]["labels"] = "a=b"
    assert any("labels" in problem for problem in kuberay_rules(service))


def core_objects() -> list[dict]:
    objects = [doc for doc in documents() if doc["kind"] in {"Namespace", "Service", "Deployment", "PodDisruptionBudget"}]
    service = the_rayservice()
    ingress = {"apiVersion": "v1", "kind": "Service", **copy.deepcopy(service["spec"]["serveService"])}
    ingress["metadata"]["namespace"] = SPEC.namespace
    templates = [pod_template_object(name, template, SPEC.namespace) for name, template in ray_pod_templates(service)]
    return objects + [ingress] + templates


@pytest.mark.parametrize("obj", core_objects(), ids=lambda o: f"{o['kind']}-{o['metadata']['name']}")
def test_core_objects_match_kubernetes_schemas(obj):
    assert core_errors(obj, SPEC.kubernetes_version) == []


@pytest.mark.parametrize("kind, path, typo", [
    ("PodDisruptionBudget", ("spec",), "maxUnavailabe"),
    ("Deployment", ("spec", "template", "spec", "containers", 0), "imagePullPolice"),
    ("Service", ("spec",), "selecter"),
])
def test_a_misspelt_field_fails_kubernetes_validate(kind, path, typo):
    obj = copy.deepcopy(by_kind(kind)[0])
    node = obj
    for key in path:
        node = node[key]
    node[typo] = "x"
    errors = core_errors(obj, SPEC.kubernetes_version)
    assert errors and typo in errors[0]


def test_a_misspelt_field_fails_the_ray_pod_template():
    name, template = ray_pod_templates(the_rayservice())[1]
    template = copy.deepcopy(template)
    template["spec"]["containers"][0]["resources"]["limit"] = {"cpu": "1"}
    assert core_errors(pod_template_object(name, template, SPEC.namespace), SPEC.kubernetes_version)


@pytest.mark.parametrize("obj", by_kind("NodePool") + by_kind("EC2NodeClass"),
                         ids=lambda o: f"{o['kind']}-{o['metadata']['name']}")
def test_karpenter_objects_match_the_hand_written_schema(obj):
    assert karpenter_errors(obj) == []


@pytest.mark.parametrize("kind, path, typo", [
    ("NodePool", ("spec", "template", "spec"), "requirement"),
    ("NodePool", ("spec", "disruption"), "consolidationPolicyy"),
    ("EC2NodeClass", ("spec",), "amiSelectorTerm"),
    ("EC2NodeClass", ("spec", "metadataOptions"), "httpPutResponseHopLimits"),
])
def test_a_misspelt_field_fails_the_karpenter_schema(kind, path, typo):
    obj = copy.deepcopy(by_kind(kind)[0])
    node = obj
    for key in path:
        node = node[key]
    node[typo] = "x"
    errors = karpenter_errors(obj)
    assert any(typo in error for error in errors), errors


def test_karpenter_refuses_a_restricted_node_label():
    pool = copy.deepcopy(by_kind("NodePool")[0])
    pool["spec"]["template"]["metadata"]["labels"]["karpenter.sh/nodepool"] = "x"
    assert karpenter_errors(pool)
