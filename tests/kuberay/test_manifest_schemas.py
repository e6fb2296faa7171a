"""Every generated manifest validates, and a misspelt field fails each validator."""

from __future__ import annotations

import copy

import pytest

from serve_app.tools.kuberay.spec import load_spec
from tests.conftest import REPO
from tests.kuberay.schemas import (
    KARPENTER_CEL_MESSAGES,
    KARPENTER_CRD_FILES,
    KARPENTER_CRDS,
    KUBERAY_CRDS,
    core_errors,
    crd_errors,
    karpenter_errors,
    karpenter_rules,
    kuberay_rules,
    load_documents,
    pod_template_object,
)

SPEC = load_spec(REPO / "kuberay/cluster.yaml")
MANIFESTS = REPO / "kuberay" / SPEC.output_dir
needs_crds = pytest.mark.skipif(not KUBERAY_CRDS.is_dir(), reason=f"KubeRay CRDs not found in {KUBERAY_CRDS}")
needs_karpenter_crds = pytest.mark.skipif(not KARPENTER_CRDS.is_dir(),
                                          reason=f"Karpenter CRDs not found in {KARPENTER_CRDS}")


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
                     "PodDisruptionBudget", "NetworkPolicy"}


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


def test_kuberay_rules_catch_token_auth_on_a_ray_without_it():
    service = copy.deepcopy(the_rayservice())
    service["spec"]["rayClusterConfig"]["rayVersion"] = "2.51.1"
    assert any("rayVersion 2.52.0" in problem for problem in kuberay_rules(service))


def core_objects() -> list[dict]:
    core = {"Namespace", "Service", "Deployment", "PodDisruptionBudget", "NetworkPolicy"}
    objects = [doc for doc in documents() if doc["kind"] in core]
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
    ("NetworkPolicy", ("spec", "ingress", 0), "form"),
    ("NetworkPolicy", ("spec",), "podSelecter"),
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


def karpenter_objects() -> list[dict]:
    return by_kind("NodePool") + by_kind("EC2NodeClass")


@needs_karpenter_crds
@pytest.mark.parametrize("obj", karpenter_objects(), ids=lambda o: f"{o['kind']}-{o['metadata']['name']}")
def test_karpenter_objects_match_their_crds(obj):
    assert karpenter_errors(obj) == []


@needs_karpenter_crds
@pytest.mark.parametrize("kind, path, typo", [
    ("NodePool", ("spec", "template", "spec"), "requirement"),
    ("NodePool", ("spec", "disruption"), "consolidationPolicyy"),
    ("NodePool", ("spec", "template", "spec", "nodeClassRef"), "nam"),
    ("EC2NodeClass", ("spec",), "amiSelectorTerm"),
    ("EC2NodeClass", ("spec", "metadataOptions"), "httpPutResponseHopLimits"),
    ("EC2NodeClass", ("spec", "blockDeviceMappings", 0, "ebs"), "volumeSiz"),
])
def test_a_misspelt_field_fails_the_karpenter_crd(kind, path, typo):
    obj = copy.deepcopy(by_kind(kind)[0])
    node = obj
    for key in path:
        node = node[key]
    node[typo] = "x"
    errors = karpenter_errors(obj)
    assert any(typo in error for error in errors), errors


@needs_karpenter_crds
@pytest.mark.parametrize("kind, path, value", [
    ("NodePool", ("spec", "disruption", "consolidationPolicy"), "WhenIdle"),
    ("NodePool", ("spec", "template", "spec", "expireAfter"), "30 days"),
    ("EC2NodeClass", ("spec", "metadataOptions", "httpTokens"), "sometimes"),
    ("EC2NodeClass", ("apiVersion",), "karpenter.k8s.aws/v1beta1"),
])
def test_a_wrong_value_fails_the_karpenter_crd(kind, path, value):
    obj = copy.deepcopy(by_kind(kind)[0])
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert karpenter_errors(obj)


@pytest.mark.parametrize("obj", karpenter_objects(), ids=lambda o: f"{o['kind']}-{o['metadata']['name']}")
def test_karpenter_objects_pass_the_cel_rules(obj):
    assert karpenter_rules(obj) == []


@pytest.mark.parametrize("label", ["karpenter.sh/nodepool", "kubernetes.io/hostname", "example.kubernetes.io/x",
                                   "karpenter.k8s.aws/anything", "k8s.io/x"])
def test_karpenter_refuses_a_restricted_node_label(label):
    pool = copy.deepcopy(by_kind("NodePool")[0])
    pool["spec"]["template"]["metadata"]["labels"][label] = "x"
    assert karpenter_rules(pool)


@pytest.mark.parametrize("change", [
    {"instanceProfile": "both-set"},
    {"amiSelectorTerms": [{"alias": "ubuntu@latest"}]},
    {"tags": {"kubernetes.io/cluster/x": "owned"}},
])
def test_karpenter_rules_refuse_a_bad_node_class(change):
    node_class = copy.deepcopy(by_kind("EC2NodeClass")[0])
    node_class["spec"].update(change)
    assert karpenter_rules(node_class)


def cel_messages(kind: str) -> set[str]:
    crd = load_documents(KARPENTER_CRDS / KARPENTER_CRD_FILES[kind])[0]
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            found.update(rule["message"] for rule in node.get("x-kubernetes-validations", []) if "message" in rule)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(crd)
    return found


@needs_karpenter_crds
@pytest.mark.parametrize("kind", sorted(KARPENTER_CEL_MESSAGES))
def test_the_mirrored_cel_rules_are_in_the_crd(kind):
    """If Karpenter renames or drops a rule, `karpenter_rules` needs a look."""
    assert set(KARPENTER_CEL_MESSAGES[kind]) <= cel_messages(kind)
