"""Validators for the generated manifests, one per kind of schema.

- RayService / RayCluster: the KubeRay v1.7.0 CRDs' openAPIV3Schema, made strict
  (CRD schemas accept unknown fields; here every object that lists `properties`
  and does not preserve unknown fields refuses others).
- Karpenter NodePool / EC2NodeClass: the Karpenter v1.14.1 CRDs'
  openAPIV3Schema, made strict the same way. Their CEL rules
  (`x-kubernetes-validations`) are not run by jsonschema; `karpenter_rules`
  mirrors the few these objects could trip.
- Core objects (Namespace, Service, Deployment, PodDisruptionBudget,
  NetworkPolicy, the Ray pod templates): `kubernetes-validate` in strict mode.
- `kuberay_rules`: checks the KubeRay operator makes at admission (its
  `ValidateRayClusterSpec` / `ValidateRayServiceSpec`) that no schema expresses.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from tests.conftest import REPO

KUBERAY_CRDS = REPO.parent / "shared" / "kuberay-crds"
KARPENTER_CRDS = REPO.parent / "shared" / "karpenter-crds"


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with additionalProperties: false wherever properties are listed."""
    node = dict(schema)
    if "properties" in node:
        node["properties"] = {name: strict(sub) for name, sub in node["properties"].items()}
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
    for key in ("items", "additionalProperties", "not"):
        if isinstance(node.get(key), dict):
            node[key] = strict(node[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            node[key] = [strict(sub) for sub in node[key]]
    return node


@cache
def crd_validator(filename: str, folder: Path = KUBERAY_CRDS) -> tuple[str, str, jsonschema.Draft7Validator]:
    """(apiVersion, kind, validator) of the storage version of one CRD file."""
    crd = yaml.load((folder / filename).read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    schema = strict(version["schema"]["openAPIV3Schema"])
    api_version = f"{crd['spec']['group']}/{version['name']}"
    return api_version, crd["spec"]["names"]["kind"], jsonschema.Draft7Validator(schema)


def crd_errors(obj: dict[str, Any], filename: str, folder: Path = KUBERAY_CRDS) -> list[str]:
    api_version, kind, validator = crd_validator(filename, folder)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    if (obj.get("apiVersion"), obj.get("kind")) != (api_version, kind):
        errors.append(f"expected {api_version} {kind}, got {obj.get('apiVersion')} {obj.get('kind')}")
    return errors


def core_errors(obj: dict[str, Any], kubernetes_version: str) -> list[str]:
    try:
        kubernetes_validate.validate(obj, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.absolute_path))}: {exc.message}"]
    return []


def pod_template_object(name: str, template: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A Ray group's pod template as a core PodTemplate, so kubernetes-validate checks it."""
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name, "namespace": namespace},
            "template": template}


# --- Karpenter CEL rules -------------------------------------------------------

KARPENTER_CRD_FILES = {"NodePool": "karpenter.sh_nodepools.yaml", "EC2NodeClass": "karpenter.k8s.aws_ec2nodeclasses.yaml"}
KARPENTER_CEL_MESSAGES = {
    "NodePool": ['label domain "karpenter.sh" is restricted', 'label "karpenter.sh/nodepool" is restricted',
                 'label "kubernetes.io/hostname" is restricted', 'label domain "karpenter.k8s.aws" is restricted'],
    "EC2NodeClass": ["must specify exactly one of ['role', 'instanceProfile']",
                     "'alias' is improperly formatted, must match the format 'family@version'",
                     "tag contains a restricted tag matching kubernetes.io/cluster/",
                     "tag contains a restricted tag matching eks:eks-cluster-name"],
}
"""Messages of the CRDs' `x-kubernetes-validations` that `karpenter_rules` mirrors."""
_RESTRICTED_DOMAINS = ("kubernetes.io", "k8s.io", "karpenter.sh", "karpenter.k8s.aws")
_ALLOWED_DOMAINS = ("node.kubernetes.io", "node-restriction.kubernetes.io")
_AMI_FAMILIES = ("al2", "al2023", "bottlerocket", "windows2019", "windows2022", "windows2025")


def karpenter_errors(obj: dict[str, Any]) -> list[str]:
    """Schema errors of a NodePool or EC2NodeClass against its Karpenter CRD."""
    filename = KARPENTER_CRD_FILES.get(obj.get("kind", ""))
    if filename is None:
        return [f"no Karpenter CRD for kind {obj.get('kind')}"]
    return crd_errors(obj, filename, KARPENTER_CRDS)


def karpenter_rules(obj: dict[str, Any]) -> list[str]:
    """The CEL rules (`x-kubernetes-validations`, which jsonschema does not run)
    these objects could trip, plus Karpenter's refusal of node labels in the
    kubernetes.io / k8s.io domains (checked by its controller, not its CRD)."""
    spec = obj["spec"]
    if obj["kind"] == "NodePool":
        problems = []
        for key in spec["template"].get("metadata", {}).get("labels", {}):
            domain = key.split("/")[0] if "/" in key else ""
            if key in ("karpenter.sh/nodepool", "kubernetes.io/hostname") or (
                    domain.endswith(_RESTRICTED_DOMAINS) and not domain.endswith(_ALLOWED_DOMAINS)):
                problems.append(f"node label {key} is restricted")
        return problems
    problems = []
    if ("role" in spec) == ("instanceProfile" in spec):
        problems.append("must specify exactly one of ['role', 'instanceProfile']")
    for term in spec["amiSelectorTerms"]:
        family, at, _version = term.get("alias", "x@x").partition("@")
        if not at or family not in _AMI_FAMILIES:
            problems.append(f"AMI alias {term['alias']} is not family@version of a known family")
    for key in spec.get("tags", {}):
        if key == "eks:eks-cluster-name" or key.startswith("kubernetes.io/cluster"):
            problems.append(f"tag {key} is restricted")
    return problems


# --- KubeRay admission rules --------------------------------------------------

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_QUALIFIED = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_LABEL_NAME}$")
_VALUE = re.compile(rf"^({_LABEL_NAME})?$")


def kuberay_rules(rayservice: dict[str, Any]) -> list[str]:
    """The subset of KubeRay's admission checks these manifests could trip."""
    problems = []
    spec = rayservice["spec"]
    cluster = spec["rayClusterConfig"]
    if not _DNS1035.match(rayservice["metadata"]["name"]):
        problems.append("RayService name is not a DNS-1035 label")
    if spec.get("upgradeStrategy", {}).get("type") not in (None, "NewCluster", "None", "NewClusterWithIncrementalUpgrade"):
        problems.append("upgradeStrategy.type is invalid")
    groups = [("head", cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster.get("workerGroupSpecs", [])]
    for name, group in groups:
        params = group.get("rayStartParams", {})
        if group.get("resources") and any(params.get(key) for key in ("num-cpus", "num-gpus", "memory", "resources")):
            problems.append(f"{name}: resources set in both rayStartParams and resources")
        if "labels" in params:
            problems.append(f"{name}: rayStartParams['labels'] is not supported; use labels")
        for key, value in group.get("labels", {}).items():
            if not _QUALIFIED.match(key) or len(key.rsplit("/", 1)[-1]) > 63 or not _VALUE.match(value) or len(value) > 63:
                problems.append(f"{name}: invalid label {key}={value}")
        if not group["template"]["spec"].get("containers"):
            problems.append(f"{name}: no container")
        if cluster.get("enableInTreeAutoscaling") and group["template"]["spec"].get("restartPolicy", "Never") != "Never":
            problems.append(f"{name}: restartPolicy must be Never or unset with autoscaler v2")
        if name != "head" and not group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"]:
            problems.append(f"{name}: need minReplicas <= replicas <= maxReplicas")
    head = cluster["headGroupSpec"]
    env = {var["name"] for var in head["template"]["spec"]["containers"][0].get("env", [])}
    if cluster.get("gcsFaultToleranceOptions"):
        if "redis-password" in head.get("rayStartParams", {}) or env & {"REDIS_PASSWORD", "RAY_REDIS_ADDRESS"}:
            problems.append("head: Redis set outside gcsFaultToleranceOptions")
    if cluster.get("autoscalerOptions", {}).get("version") and "RAY_enable_autoscaler_v2" in env:
        problems.append("head: both autoscalerOptions.version and RAY_enable_autoscaler_v2")
    if head.get("headService", {}).get("metadata", {}).get("name"):
        problems.append("headService.metadata.name must not be set")
    auth = cluster.get("authOptions", {})
    ray_version = tuple(int(part) for part in re.findall(r"\d+", cluster.get("rayVersion", ""))[:3])
    if auth.get("mode") == "token" and ray_version < (2, 52, 0):
        problems.append("authOptions.mode token needs rayVersion 2.52.0 or later")
    if auth.get("enableK8sTokenAuth"):
        problems.append("authOptions.enableK8sTokenAuth is not supported for a RayService")
    return problems


def load_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]
