"""Validators for the generated manifests, one per kind of schema.

- RayService / RayCluster: the KubeRay v1.7.0 CRDs' openAPIV3Schema, made strict
  (CRD schemas accept unknown fields; here every object that lists `properties`
  and does not preserve unknown fields refuses others).
- Core objects (Namespace, Service, Deployment, PodDisruptionBudget, the Ray pod
  templates): `kubernetes-validate` in strict mode.
- Karpenter NodePool / EC2NodeClass: no schema is available offline, so
  `KARPENTER` below is HAND-WRITTEN from the Karpenter v1 API reference and
  covers only the fields these manifests use.
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

CRD_DIR = REPO.parent / "shared" / "kuberay-crds"


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
def crd_validator(filename: str) -> tuple[str, str, jsonschema.Draft7Validator]:
    """(apiVersion, kind, validator) of the storage version of one CRD file."""
    crd = yaml.load((CRD_DIR / filename).read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    schema = strict(version["schema"]["openAPIV3Schema"])
    api_version = f"{crd['spec']['group']}/{version['name']}"
    return api_version, crd["spec"]["names"]["kind"], jsonschema.Draft7Validator(schema)


def crd_errors(obj: dict[str, Any], filename: str) -> list[str]:
    api_version, kind, validator = crd_validator(filename)
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


# --- Karpenter (hand-written) -----------------------------------------------

STRING = {"type": "string"}
BOOLEAN = {"type": "boolean"}
STRING_MAP = {"type": "object", "additionalProperties": STRING}
DURATION = {"type": "string", "pattern": r"^((([0-9]+(s|m|h))+)|(Never))$"}
QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?([KMGTPE]i|[numkMGTPE])?$"}]}
RESTRICTED_LABEL = (  # node-label domains Karpenter refuses (its allow-list of well-known keys not modelled)
    r"^(?!([^/]*\.)?(node|node-restriction)\.kubernetes\.io/)([^/]*\.)?(kubernetes\.io|k8s\.io|karpenter\.sh|karpenter\.k8s\.aws)/"
)


def _object(required: tuple[str, ...] = (), **properties: Any) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "required": list(required), "properties": properties}


def _list(item: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "array", "items": item, **extra}


def _top(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    metadata = _object(("name",), name=STRING, labels=STRING_MAP, annotations=STRING_MAP)
    return _object(("apiVersion", "kind", "metadata", "spec"), apiVersion={"const": api_version},
                   kind={"const": kind}, metadata=metadata, spec=spec)


TAINT = _object(("key", "effect"), key=STRING, value=STRING,
                effect={"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]})
REQUIREMENT = _object(("key", "operator"), key=STRING, values=_list(STRING),
                      operator={"enum": ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]},
                      minValues={"type": "integer", "minimum": 1, "maximum": 50})
NODE_POOL = _top("karpenter.sh/v1", "NodePool", _object(
    ("template",),
    template=_object(
        ("spec",),
        metadata=_object(labels={**STRING_MAP, "propertyNames": {"not": {"pattern": RESTRICTED_LABEL}}},
                         annotations=STRING_MAP),
        spec=_object(
            ("nodeClassRef", "requirements"),
            nodeClassRef=_object(("group", "kind", "name"), group=STRING, kind=STRING, name=STRING),
            requirements=_list(REQUIREMENT, maxItems=100),
            taints=_list(TAINT),
            startupTaints=_list(TAINT),
            expireAfter=DURATION,
            terminationGracePeriod=DURATION,
        ),
    ),
    disruption=_object(
        ("consolidateAfter",),
        consolidateAfter=DURATION,
        consolidationPolicy={"enum": ["WhenEmpty", "WhenEmptyOrUnderutilized"]},
        budgets=_list(_object(("nodes",), nodes={"type": "string", "pattern": r"^((100|[0-9]{1,2})%|[0-9]+)$"},
                              reasons=_list({"enum": ["Underutilized", "Empty", "Drifted"]}),
                              schedule=STRING, duration=STRING)),
    ),
    limits={"type": "object", "additionalProperties": QUANTITY},
    weight={"type": "integer", "minimum": 1, "maximum": 100},
))
SELECTOR_TERM = _object(id=STRING, name=STRING, tags=STRING_MAP)
EC2_NODE_CLASS = _top("karpenter.k8s.aws/v1", "EC2NodeClass", {
    **_object(
        ("amiSelectorTerms", "subnetSelectorTerms", "securityGroupSelectorTerms"),
        role=STRING,
        instanceProfile=STRING,
        amiFamily={"enum": ["AL2", "AL2023", "Bottlerocket", "Windows2019", "Windows2022", "Custom"]},
        amiSelectorTerms=_list(_object(alias={"type": "string", "pattern": r"^[a-z0-9]+@(latest|v[0-9]+)$"},
                                       id=STRING, name=STRING, owner=STRING, tags=STRING_MAP), minItems=1),
        subnetSelectorTerms=_list(SELECTOR_TERM, minItems=1),
        securityGroupSelectorTerms=_list(SELECTOR_TERM, minItems=1),
        blockDeviceMappings=_list(_object(
            deviceName=STRING, rootVolume=BOOLEAN,
            ebs=_object(volumeSize=QUANTITY, volumeType={"enum": ["standard", "io1", "io2", "gp2", "gp3", "sc1", "st1"]},
                        encrypted=BOOLEAN, deleteOnTermination=BOOLEAN, iops={"type": "integer"},
                        throughput={"type": "integer"}, kmsKeyID=STRING, snapshotID=STRING),
        )),
        metadataOptions=_object(httpEndpoint={"enum": ["enabled", "disabled"]},
                                httpProtocolIPv6={"enum": ["enabled", "disabled"]},
                                httpPutResponseHopLimit={"type": "integer", "minimum": 1, "maximum": 64},
                                httpTokens={"enum": ["required", "optional"]}),
        instanceStorePolicy={"enum": ["RAID0"]},
        tags=STRING_MAP,
        userData=STRING,
    ),
    "oneOf": [{"required": ["role"]}, {"required": ["instanceProfile"]}],
})
KARPENTER = {"NodePool": NODE_POOL, "EC2NodeClass": EC2_NODE_CLASS}


def karpenter_errors(obj: dict[str, Any]) -> list[str]:
    schema = KARPENTER.get(obj.get("kind", ""))
    if schema is None:
        return [f"no hand-written schema for kind {obj.get('kind')}"]
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]


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
    return problems


def load_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]
