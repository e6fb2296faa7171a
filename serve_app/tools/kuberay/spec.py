"""The generator's input beside the Serve config: `kuberay/cluster.yaml` as a `ClusterSpec`.

Images, pod shapes of the Ray groups, Karpenter pools and node classes, Secret
names, Spot timing and who may reach the cluster. Worker-group sizes are not
here: they follow from the Serve config's deployments (`sizing`).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field, IPvAnyNetwork, field_validator, model_validator

from serve_app.capacity import ANY_CAPACITY, ON_DEMAND, CapacityType
from serve_app.config import StrictModel

HEAD_GROUP = "headgroup"
"""Name the head's pods go by, among the worker-group names."""


class InstanceType(StrictModel):
    """Shape of one EC2 instance type."""

    cpu: int = Field(gt=0)
    """vCPUs."""
    memory_gib: int = Field(gt=0)
    """Memory in GiB."""
    gpus: int = Field(default=0, ge=0)
    """NVIDIA GPUs."""


class NodeClass(StrictModel):
    """A Karpenter EC2NodeClass: AMI, disks and instance metadata of its nodes."""

    name: str
    """Object name."""
    ami_alias: str = "al2023@latest"
    """Karpenter AMI alias; the AL2023 family picks the NVIDIA variant for GPU
    instances. Pin a version (`al2023@v2026...`) in production."""
    root_volume_gib: int = Field(gt=0)
    """Root EBS volume (gp3): images, and model weights without instance storage."""
    instance_store_raid0: bool = False
    """Put kubelet and container storage on the instance's NVMe disks."""


class NodePool(StrictModel):
    """A Karpenter NodePool: one capacity type over several instance types."""

    name: str
    """Object name; pods select it with `karpenter.sh/nodepool`."""
    capacity_type: CapacityType
    """EC2 purchase option (`spot` or `on-demand`); also the Ray label
    `ray.io/market-type` of its pods."""
    node_class: str
    """Name of the `NodeClass` its nodes use."""
    instance_types: list[str] = Field(min_length=1)
    """Instance types Karpenter may launch (keys of `ClusterSpec.instance_types`)."""

    @field_validator("capacity_type")
    @classmethod
    def _a_purchase_option(cls, capacity_type: CapacityType) -> CapacityType:
        if capacity_type == ANY_CAPACITY:
            raise ValueError("a node pool is either spot or on-demand")
        return capacity_type


class PodShape(StrictModel):
    """Container requests (= limits) of a Ray pod, and where it runs."""

    node_pool: str
    """Name of the `NodePool` the pod is scheduled on."""
    cpu: int = Field(gt=0)
    """vCPUs; also the Ray `CPU` resource of the node."""
    memory_gib: int = Field(gt=0)
    """Memory in GiB."""
    gpus: int = Field(default=0, ge=0)
    """NVIDIA GPUs; also the Ray `GPU` resource. GPU pods run the GPU image."""


class WorkerGroup(PodShape):
    """One KubeRay worker group."""

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """groupName; also the Ray label `ray.io/node-group`."""


class SpotTiming(StrictModel):
    """How a worker leaves within the Spot interruption notice."""

    notice_s: int = Field(default=120, gt=0)
    """AWS Spot interruption notice."""
    termination_grace_period_s: int = Field(default=120, gt=0)
    """Pod terminationGracePeriodSeconds: SIGTERM to SIGKILL."""
    drain_timeout_s: int = Field(default=100, gt=0)
    """RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S: after SIGTERM the node drains this
    long (replicas finish in-flight work) before Ray stops its processes."""
    teardown_margin_s: int = Field(default=10, ge=0)
    """Time Ray needs after the drain to stop its processes."""

    @model_validator(mode="after")
    def _fits_the_notice(self) -> SpotTiming:
        if not self.drain_timeout_s + self.teardown_margin_s <= self.termination_grace_period_s <= self.notice_s:
            raise ValueError("need drain_timeout_s + teardown_margin_s <= termination_grace_period_s <= notice_s")
        return self


class Images(StrictModel):
    """Images built from kuberay/Dockerfile; Ray and Python match across both."""

    gpu: str
    """`serve-app[gpu]` on the CUDA Ray image: GPU workers."""
    cpu: str
    """`serve-app[cpu]` on the CPU Ray image: head and CPU workers (tiny tier)."""


class Secrets(StrictModel):
    """Names of Secrets created by hand in the namespace (values never in git)."""

    redis_password: str = "serve-app-redis"
    """Key `password`: Redis AUTH for GCS fault tolerance."""
    hf_token: str = "serve-app-hf-token"
    """Key `token`: Hugging Face token for gated models (optional Secret)."""
    api_keys: str = "serve-app-api-keys"
    """One key per `ingress.api_keys[].env` of the Serve config (the variable's
    name) or `file` (the file's name), holding the API key; only pods that can
    run the ingress get it."""
    ray_auth_token: str = "serve-app-ray-auth"
    """Key `auth_token`: Ray's cluster token (`RAY_AUTH_MODE=token`), which every
    Ray process, the KubeRay operator and `ray` clients present."""


class RedisSpec(StrictModel):
    """External Redis of GCS fault tolerance."""

    address: str | None = None
    """ElastiCache endpoint (`rediss://host:6379`); None deploys a Redis in the namespace."""
    image: str = "redis:7.4-alpine"
    """Image of the in-cluster Redis."""
    node_pool: str
    """NodePool of the in-cluster Redis."""


class NodeReserve(StrictModel):
    """What kubelet, the OS and DaemonSets take from every node."""

    cpu: float = Field(default=1, ge=0)
    """vCPUs."""
    memory_gib: float = Field(default=4, ge=0)
    """GiB."""


class NetworkAccess(StrictModel):
    """Who may open connections to the pods (NetworkPolicies); Ray pods of the
    cluster always reach each other on every port."""

    serve_client_cidrs: list[IPvAnyNetwork] = Field(min_length=1)
    """Sources allowed on the Serve port of the workers: the VPC's CIDRs, which
    hold the internal NLB's addresses (IP targets) and, with client IP
    preservation, its clients."""
    kuberay_operator_namespace: str = "kuberay-system"
    """Namespace of the KubeRay operator, which deploys the Serve config and
    reads its status through the head's dashboard port."""
    monitoring_namespace: str = "monitoring"
    """Namespace of the Prometheus that scrapes the metrics port."""


class ClusterSpec(StrictModel):
    """Everything the manifests need beyond the Serve config."""

    name: str = Field(pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=40)
    """RayService name (DNS-1035) and the `app.kubernetes.io/instance` label."""
    namespace: str
    """Namespace of all namespaced objects."""
    serve_config: str
    """Serve config file, relative to this spec's folder."""
    output_dir: str = "manifests"
    """Folder the manifests are written to, relative to this spec's folder."""
    kubernetes_version: str
    """EKS Kubernetes version the core objects are validated against."""
    eks_cluster_name: str
    """Value of the `karpenter.sh/discovery` tag on the cluster's subnets and security groups."""
    node_role: str
    """IAM role of Karpenter-launched nodes."""
    images: Images
    """Container images."""
    secrets: Secrets = Field(default_factory=Secrets)
    """Secret names."""
    redis: RedisSpec
    """GCS fault-tolerance Redis."""
    network: NetworkAccess
    """Allowed sources of traffic into the pods."""
    spot: SpotTiming = Field(default_factory=SpotTiming)
    """Drain timing of worker pods."""
    autoscaler_idle_timeout_s: int = Field(default=300, gt=0)
    """Seconds a worker stays idle before the Ray autoscaler removes it."""
    head: PodShape
    """Head pod (schedules nothing: `num-cpus: 0`)."""
    groups: list[WorkerGroup] = Field(min_length=1)
    """Worker groups; when several can host a replica, the one with the fewest
    GPUs, then the first listed, is where it is counted."""
    node_pools: list[NodePool] = Field(min_length=1)
    """Karpenter NodePools."""
    node_classes: list[NodeClass] = Field(min_length=1)
    """Karpenter EC2NodeClasses."""
    node_reserved: NodeReserve = Field(default_factory=NodeReserve)
    """Per-node reserve a pod must leave free."""
    instance_types: dict[str, InstanceType]
    """EC2 instance shapes by name."""

    @model_validator(mode="after")
    def _consistent(self) -> ClusterSpec:
        names = [group.name for group in self.groups]
        if len(set(names)) != len(names) or HEAD_GROUP in names:
            raise ValueError(f"group names must be unique and not {HEAD_GROUP!r}: {names}")
        classes = {node_class.name for node_class in self.node_classes}
        for pool in self.node_pools:
            if pool.node_class not in classes:
                raise ValueError(f"node pool {pool.name}: unknown node class {pool.node_class}")
            unknown = sorted(set(pool.instance_types) - set(self.instance_types))
            if unknown:
                raise ValueError(f"node pool {pool.name}: unknown instance types {unknown}")
        if self.pool(self.head.node_pool).capacity_type != ON_DEMAND:
            raise ValueError("the head must run on an on-demand node pool")
        self.pool(self.redis.node_pool)
        for name, shape in [("head", self.head), *((group.name, group) for group in self.groups)]:
            if not any(self.fits(shape, self.instance_types[t]) for t in self.pool(shape.node_pool).instance_types):
                raise ValueError(f"{name}: the pod fits no instance type of node pool {shape.node_pool}")
        return self

    def pool(self, name: str) -> NodePool:
        for pool in self.node_pools:
            if pool.name == name:
                return pool
        raise ValueError(f"unknown node pool {name}")

    def has_gpus(self, pool: NodePool) -> bool:
        """Whether any instance type of the pool has GPUs."""
        return any(self.instance_types[name].gpus for name in pool.instance_types)

    def fits(self, shape: PodShape, instance: InstanceType) -> bool:
        """Whether the pod fits the instance after the per-node reserve."""
        reserve = self.node_reserved
        return (
            shape.cpu <= instance.cpu - reserve.cpu
            and shape.memory_gib <= instance.memory_gib - reserve.memory_gib
            and shape.gpus <= instance.gpus
        )


def load_spec(spec_path: Path) -> ClusterSpec:
    """Read and validate a cluster spec file."""
    return ClusterSpec.model_validate(yaml.safe_load(spec_path.read_text(encoding="utf-8")))
