"""The Kubernetes objects of one cluster, as plain dicts: Namespace, RayService
(head, worker groups, ingress Service), Karpenter EC2NodeClasses and NodePools,
the in-cluster GCS Redis, PodDisruptionBudgets and NetworkPolicies."""

from __future__ import annotations

import posixpath
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ray import __version__ as ray_version
from ray.serve.config import HTTPOptions

from serve_app.capacity import MARKET_TYPE_LABEL, SPOT
from serve_app.tools.kuberay.spec import HEAD_GROUP, ClusterSpec, NodePool, PodShape

SPOT_TAINT = {"key": "serve-app/capacity-type", "value": "spot", "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
METRICS_PORT = 8080
"""Ray's metrics export port on every Ray pod."""
DASHBOARD_PORT, GCS_PORT, CLIENT_PORT = 8265, 6379, 10001
"""The head's Ray ports (KubeRay's defaults, which it also gives its head Service)."""
REDIS_PORT = 6379
UPGRADE_SURGE = 2
"""A NewCluster upgrade runs the old and the new RayCluster side by side."""
RAY_POD_LABELS = {"ray.io/is-ray-node": "yes"}
"""Label KubeRay puts on every pod of a RayCluster (and its GCS cleanup Job)."""
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
"""KubeRay pod label: `head` or `worker`."""
RAY_AUTH_TOKEN_KEY = "auth_token"
"""Key of Ray's cluster token in its Secret: the one KubeRay reads for its own
calls to the dashboard (`authOptions.secretName`)."""
IMDS_HOP_LIMIT = 1
"""IMDSv2 answers do not leave the node: no pod reaches instance metadata, so
none can take the node's IAM role. Spot notices reach pods as Karpenter's drain."""
API_KEY_VOLUME = "api-keys"
"""Name prefix of the volumes that mount the API-key Secret (one per folder)."""


@dataclass(frozen=True)
class ServeSide:
    """What the RayService takes from the Serve config."""

    config_text: str = ""
    """The Serve config, embedded as `serveConfigV2`."""
    port: int = HTTPOptions().port
    """Port of the Serve proxies (`http_options.port`)."""
    api_key_envs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """By group: the variables of `ingress.api_keys[].env` its pods get from the
    `api_keys` Secret (the groups an ingress replica can land on)."""
    api_key_files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """By group: the paths of `ingress.api_keys[].file` mounted in its pods from
    the `api_keys` Secret, each file the Secret key of its name (the groups an
    ingress replica can land on)."""


def labels(spec: ClusterSpec, component: str | None = None) -> dict[str, str]:
    """Kubernetes labels of this cluster's objects, and of one component's."""
    common = {"app.kubernetes.io/name": "serve-app", "app.kubernetes.io/instance": spec.name}
    return {**common, "app.kubernetes.io/component": component} if component else common


def node_labels(spec: ClusterSpec) -> dict[str, str]:
    """Labels (and EC2 tags) of launched nodes: Karpenter refuses *kubernetes.io domains there."""
    return {"serve-app/instance": spec.name}


def secret_env(name: str, secret: str, key: str, optional: bool) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": optional}}}


def namespace(spec: ClusterSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": spec.namespace, "labels": labels(spec)}}


def pool_taints(spec: ClusterSpec, pool: NodePool) -> list[dict[str, str]]:
    """GPU pools keep other pods off; Spot pools take only pods that tolerate Spot."""
    return [taint for taint, applies in ((GPU_TAINT, spec.has_gpus(pool)), (SPOT_TAINT, pool.capacity_type == SPOT))
            if applies]


def _key_file_volumes(secret: str, paths: tuple[str, ...]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Volumes and mounts that put each Secret key at its path: one volume per folder."""
    folders: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        folder, name = posixpath.split(path)
        folders[folder].append(name)
    volumes, mounts = [], []
    for index, (folder, names) in enumerate(sorted(folders.items())):
        name = f"{API_KEY_VOLUME}-{index}"
        items = [{"key": key, "path": key} for key in sorted(names)]
        volumes.append({"name": name, "secret": {"secretName": secret, "items": items}})
        mounts.append({"name": name, "mountPath": folder, "readOnly": True})
    return volumes, mounts


def _pod_template(spec: ClusterSpec, shape: PodShape, component: str, env: list[dict[str, Any]],
                  ports: dict[str, int], worker: bool, key_files: tuple[str, ...]) -> dict[str, Any]:
    pool = spec.pool(shape.node_pool)
    quantities = {"cpu": str(shape.cpu), "memory": f"{shape.memory_gib}Gi"}
    if shape.gpus:
        quantities["nvidia.com/gpu"] = str(shape.gpus)
    key_volumes, key_mounts = _key_file_volumes(spec.secrets.api_keys, key_files)
    container = {
        "name": "ray-worker" if worker else "ray-head",
        "image": spec.images.gpu if shape.gpus else spec.images.cpu,
        "imagePullPolicy": "IfNotPresent",
        "resources": {"requests": quantities, "limits": dict(quantities)},
        "env": sorted(env, key=lambda var: var["name"]),
        "ports": [{"name": name, "containerPort": port} for name, port in sorted(ports.items())],
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, *key_mounts],
    }
    pod: dict[str, Any] = {
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, *key_volumes],
        "nodeSelector": {"karpenter.sh/nodepool": pool.name, "karpenter.sh/capacity-type": pool.capacity_type},
    }
    if taints := pool_taints(spec, pool):
        pod["tolerations"] = [{"key": t["key"], "operator": "Exists", "effect": t["effect"]} for t in taints]
    metadata: dict[str, Any] = {"labels": labels(spec, component)}
    if worker:
        pod["terminationGracePeriodSeconds"] = spec.spot.termination_grace_period_s
        pod["topologySpreadConstraints"] = [{
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": labels(spec, component)},
            "matchLabelKeys": ["ray.io/cluster"],
        }]
    else:
        metadata["annotations"] = {"karpenter.sh/do-not-disrupt": "true"}
    return {"metadata": metadata, "spec": pod}


def _ray_env(spec: ClusterSpec, serve: ServeSide, group: str) -> list[dict[str, Any]]:
    """Every Ray container: Ray's token authentication (what KubeRay's `authOptions`
    would add, named here so the manifest says it), the Hugging Face token, and
    the API-key variables of the ingress where it can land."""
    keys = [secret_env(name, spec.secrets.api_keys, name, optional=False) for name in serve.api_key_envs.get(group, ())]
    return [
        {"name": "RAY_AUTH_MODE", "value": "token"},
        secret_env("RAY_AUTH_TOKEN", spec.secrets.ray_auth_token, RAY_AUTH_TOKEN_KEY, optional=False),
        secret_env("HF_TOKEN", spec.secrets.hf_token, "token", optional=True),
        *keys,
    ]


def rayservice(spec: ClusterSpec, serve: ServeSide | None = None,
               sizes: Mapping[str, tuple[int, int]] | None = None) -> dict[str, Any]:
    """The RayService; groups get minReplicas = maxReplicas = 0 until `sizes` is given."""
    serve = serve or ServeSide()
    drain = {"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": str(spec.spot.drain_timeout_s)}
    workers = []
    for group in spec.groups:
        low, high = (sizes or {}).get(group.name, (0, 0))
        env = [*_ray_env(spec, serve, group.name), drain]
        workers.append({
            "groupName": group.name,
            "replicas": low,
            "minReplicas": low,
            "maxReplicas": high,
            "labels": {MARKET_TYPE_LABEL: spec.pool(group.node_pool).capacity_type},
            "rayStartParams": {"metrics-export-port": str(METRICS_PORT)},
            "template": _pod_template(spec, group, group.name, env, {"metrics": METRICS_PORT}, True,
                                      serve.api_key_files.get(group.name, ())),
        })
    head_ports = {"gcs-server": GCS_PORT, "dashboard": DASHBOARD_PORT, "client": CLIENT_PORT, "serve": serve.port,
                  "metrics": METRICS_PORT}
    cluster = {
        "rayVersion": ray_version,
        # KubeRay reads the token from this Secret for its dashboard calls and adds
        # it to the containers it makes (autoscaler, init); no Secret of its own.
        "authOptions": {"mode": "token", "secretName": spec.secrets.ray_auth_token},
        "enableInTreeAutoscaling": True,
        "autoscalerOptions": {
            "version": "v2",
            "upscalingMode": "Default",
            "idleTimeoutSeconds": spec.autoscaler_idle_timeout_s,
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        },
        "gcsFaultToleranceOptions": {
            "redisAddress": spec.redis.address or f"{spec.name}-redis:{REDIS_PORT}",
            "redisPassword": {"valueFrom": {"secretKeyRef": {"name": spec.secrets.redis_password, "key": "password"}}},
        },
        "headGroupSpec": {
            # Not 127.0.0.1: the KubeRay operator deploys serveConfigV2 and reads
            # Serve's status through the dashboard at the head's pod address. The
            # NetworkPolicies admit only the Ray pods and the operator's namespace.
            "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0",
                               "metrics-export-port": str(METRICS_PORT)},
            "labels": {MARKET_TYPE_LABEL: spec.pool(spec.head.node_pool).capacity_type},
            "template": _pod_template(spec, spec.head, HEAD_GROUP, _ray_env(spec, serve, HEAD_GROUP), head_ports,
                                      False, serve.api_key_files.get(HEAD_GROUP, ())),
        },
        "workerGroupSpecs": workers,
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": labels(spec)},
        "spec": {
            "serveConfigV2": serve.config_text,
            "upgradeStrategy": {"type": "NewCluster"},
            "excludeHeadPodFromServeSvc": True,
            "serveService": _ingress_service(spec, serve.port),
            "rayClusterConfig": cluster,
        },
    }


def _ingress_service(spec: ClusterSpec, port: int) -> dict[str, Any]:
    """The Serve Service KubeRay points at the serving cluster: an internal NLB
    (AWS Load Balancer Controller, layer 4) on the Serve proxies of the workers."""
    annotations = {
        "service.beta.kubernetes.io/aws-load-balancer-type": "external",
        "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type": "ip",
        "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
    }
    return {
        "metadata": {"name": f"{spec.name}-ingress", "labels": labels(spec, "ingress"), "annotations": annotations},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "serve", "port": port, "targetPort": port}]},
    }


def karpenter(spec: ClusterSpec, sizes: Mapping[str, tuple[int, int]]) -> list[dict[str, Any]]:
    """EC2NodeClasses and NodePools; GPU pools capped at twice what their groups ask at max."""
    objects = []
    discovery = [{"tags": {"karpenter.sh/discovery": spec.eks_cluster_name}}]
    for node_class in spec.node_classes:
        class_spec: dict[str, Any] = {
            "role": spec.node_role,
            "amiSelectorTerms": [{"alias": node_class.ami_alias}],
            "subnetSelectorTerms": discovery,
            "securityGroupSelectorTerms": discovery,
            "blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {
                "volumeSize": f"{node_class.root_volume_gib}Gi", "volumeType": "gp3",
                "encrypted": True, "deleteOnTermination": True}}],
            "metadataOptions": {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled",
                                "httpPutResponseHopLimit": IMDS_HOP_LIMIT, "httpTokens": "required"},
            "tags": node_labels(spec),
        }
        if node_class.instance_store_raid0:
            class_spec["instanceStorePolicy"] = "RAID0"
        objects.append({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
                        "metadata": {"name": node_class.name, "labels": labels(spec)}, "spec": class_spec})
    for pool in spec.node_pools:
        template: dict[str, Any] = {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": pool.node_class},
            "requirements": [
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [pool.capacity_type]},
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": sorted(pool.instance_types)},
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
            ],
            "expireAfter": "720h",
        }
        if taints := pool_taints(spec, pool):
            template["taints"] = taints
        pool_spec: dict[str, Any] = {
            "template": {"metadata": {"labels": node_labels(spec)}, "spec": template},
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "5m"},
        }
        if spec.has_gpus(pool):
            gpus = sum(sizes[g.name][1] * g.gpus for g in spec.groups if g.node_pool == pool.name)
            pool_spec["limits"] = {"nvidia.com/gpu": str(UPGRADE_SURGE * gpus)}
        objects.append({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                        "metadata": {"name": pool.name, "labels": labels(spec)}, "spec": pool_spec})
    return objects


def redis_objects(spec: ClusterSpec) -> list[dict[str, Any]]:
    """A single in-cluster Redis (AOF on an emptyDir) behind a ClusterIP Service."""
    name, redis_labels = f"{spec.name}-redis", labels(spec, "gcs-redis")
    pool = spec.pool(spec.redis.node_pool)
    container = {
        "name": "redis",
        "image": spec.redis.image,
        "args": ["--requirepass", "$(REDIS_PASSWORD)", "--appendonly", "yes", "--dir", "/data"],
        "env": [secret_env("REDIS_PASSWORD", spec.secrets.redis_password, "password", optional=False)],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT}],
        "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    pod = {
        "containers": [container],
        "volumes": [{"name": "data", "emptyDir": {}}],
        "nodeSelector": {"karpenter.sh/nodepool": pool.name, "karpenter.sh/capacity-type": pool.capacity_type},
    }
    metadata = {"name": name, "namespace": spec.namespace, "labels": redis_labels}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": {
        "replicas": 1,
        "strategy": {"type": "Recreate"},
        "selector": {"matchLabels": redis_labels},
        "template": {"metadata": {"labels": redis_labels, "annotations": {"karpenter.sh/do-not-disrupt": "true"}},
                     "spec": pod},
    }}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": dict(metadata), "spec": {
        "selector": redis_labels, "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis"}]}}
    return [service, deployment]


def disruption_budgets(spec: ClusterSpec) -> list[dict[str, Any]]:
    """At most one pod per worker group evicted at a time (node consolidation, drains)."""
    return [{
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": f"{spec.name}-{group.name}", "namespace": spec.namespace,
                     "labels": labels(spec, group.name)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels(spec, group.name)}},
    } for group in spec.groups]


def network_policies(spec: ClusterSpec, serve_port: int) -> list[dict[str, Any]]:
    """Ingress rules of every pod here; once a policy selects a pod, all else is refused.

    Ray pods reach each other on every port (GCS, raylets, object transfer and
    worker ports are spread over many); the head's dashboard also admits the
    KubeRay operator's namespace; the workers' Serve port admits
    `network.serve_client_cidrs` (the NLB); the metrics port admits the
    monitoring namespace; the in-cluster Redis admits the Ray pods.
    """
    ray_pods = {**labels(spec), **RAY_POD_LABELS}
    from_ray = [{"podSelector": {"matchLabels": ray_pods}}]

    def from_namespace(name: str) -> list[dict[str, Any]]:
        return [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}}]

    def tcp(port: int) -> list[dict[str, Any]]:
        return [{"protocol": "TCP", "port": port}]

    def policy(name: str, pods: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, Any]:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": f"{spec.name}-{name}", "namespace": spec.namespace, "labels": labels(spec)},
                "spec": {"podSelector": {"matchLabels": pods}, "policyTypes": ["Ingress"], "ingress": rules}}

    access = spec.network
    policies = [
        policy("ray", ray_pods, [{"from": from_ray},
                                 {"from": from_namespace(access.monitoring_namespace), "ports": tcp(METRICS_PORT)}]),
        policy("ray-dashboard", {**ray_pods, RAY_NODE_TYPE_LABEL: "head"},
               [{"from": from_namespace(access.kuberay_operator_namespace), "ports": tcp(DASHBOARD_PORT)}]),
        policy("serve", {**ray_pods, RAY_NODE_TYPE_LABEL: "worker"},
               [{"from": [{"ipBlock": {"cidr": str(cidr)}} for cidr in access.serve_client_cidrs],
                 "ports": tcp(serve_port)}]),
    ]
    if not spec.redis.address:
        policies.append(policy("redis", labels(spec, "gcs-redis"), [{"from": from_ray, "ports": tcp(REDIS_PORT)}]))
    return policies
