"""Typed configuration, at the bottom of the import graph: nothing here imports
the rest of the project. One path from YAML to objects: a Serve config file's
application `args` -> `AppConfig` -> `serve_app.app:build_app`."""

from serve_app.config.app import AppConfig, app_configs, load_serve_config
from serve_app.config.autoscaling import APP_POLICY, QueueDurationAppPolicyConfig, QueueDurationAutoscaling
from serve_app.config.base import StrictModel
from serve_app.config.capacity import NoticeCapConfig, PreemptionConfig
from serve_app.config.cost import InstancePrice, PriceTable, ReplicaShape
from serve_app.config.deployment import DeploymentOptions
from serve_app.config.engine import ENGINE_BACKENDS, EngineConfig
from serve_app.config.ingress import (
    PRIORITIES,
    ApiKeyConfig,
    IngressConfig,
    PredictorConfig,
    Priority,
    PriorityConfig,
    TemplateConfig,
)
from serve_app.config.model import FallbackConfig, ModelConfig, PoolConfig
from serve_app.config.scheduling import LengthSchedulingConfig

__all__ = [
    "APP_POLICY", "ENGINE_BACKENDS", "PRIORITIES", "ApiKeyConfig", "AppConfig", "DeploymentOptions", "EngineConfig",
    "FallbackConfig", "IngressConfig", "InstancePrice", "LengthSchedulingConfig", "ModelConfig", "NoticeCapConfig", "PoolConfig",
    "PredictorConfig", "PreemptionConfig", "PriceTable", "Priority", "PriorityConfig",
    "QueueDurationAppPolicyConfig", "QueueDurationAutoscaling", "ReplicaShape", "StrictModel", "TemplateConfig",
    "app_configs", "load_serve_config",
]
