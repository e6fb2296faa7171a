"""The application config (`AppConfig`) and the Serve config files that carry it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, field_validator, model_validator

from serve_app.config.autoscaling import APP_POLICY, QueueDurationAppPolicyConfig
from serve_app.config.base import StrictModel
from serve_app.config.capacity import NoticeCapConfig, PreemptionConfig
from serve_app.config.cost import PriceTable
from serve_app.config.ingress import IngressConfig, TemplateConfig, template_placeholders
from serve_app.config.model import ModelConfig


class AppConfig(StrictModel):
    """Everything one application needs: models, templates and the ingress."""

    models: list[ModelConfig] = Field(min_length=1)
    """Served models; the first is the default when a request names none."""
    templates: dict[str, TemplateConfig] = Field(default_factory=dict)
    """Prompt templates by name."""
    ingress: IngressConfig = Field(default_factory=IngressConfig)
    """Ingress settings."""
    preemption: PreemptionConfig = Field(default_factory=PreemptionConfig)
    """How Spot replicas learn of an interruption and drain."""
    notice_cap: NoticeCapConfig = Field(default_factory=NoticeCapConfig)
    """Which requests fit in a Spot notice window (longer ones go on-demand)."""
    queue_autoscaling: bool = False
    """Pools with an `autoscaling_config` are scaled on ingress queue duration by
    the application-level policy (`APP_POLICY`), which the Serve config must name
    as the application's `autoscaling_policy`: their own Ray delays are zeroed
    and the ingress reports its queues (`record_autoscaling_stats`)."""
    cost: PriceTable | None = None
    """Instance prices and each model's replica shape: meters replica uptime by
    capacity type and attributes it to requests (`GET /v1/cost`). None: off."""

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelConfig]) -> list[ModelConfig]:
        names = [model.name for model in models]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"duplicate model names: {', '.join(duplicates)}")
        return models

    @model_validator(mode="after")
    def _fallbacks_exist(self) -> AppConfig:
        models = self.model_by_name()
        for model in self.models:
            if model.fallback is None:
                continue
            target = models.get(model.fallback.model)
            if target is None or target is model:
                raise ValueError(f"model {model.name}: fallback {model.fallback.model!r} is not another served model")
            if target.fallback is not None:
                raise ValueError(f"model {model.name}: fallback {target.name} has a fallback itself")
        return self

    @model_validator(mode="after")
    def _every_pool_is_priced(self) -> AppConfig:
        if self.cost is not None:
            for model in self.models:
                for pool in model.pools:
                    try:
                        self.cost.shape(model.name, pool.name)
                    except KeyError as exc:
                        raise ValueError(f"cost: {exc.args[0]}") from None
        return self

    @model_validator(mode="after")
    def _templates_parse(self) -> AppConfig:
        for name, template in self.templates.items():
            template_placeholders(name, template.prompt)  # raises ValueError naming the template
            template_placeholders(name, template.system or "")
        return self

    def model_by_name(self) -> dict[str, ModelConfig]:
        return {model.name: model for model in self.models}


def load_serve_config(path: str | Path) -> dict[str, Any]:
    """Read a Serve config file (the YAML `serve run` takes)."""
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def app_configs(serve_config: dict[str, Any]) -> dict[str, AppConfig]:
    """Validate the `args` of every application in a Serve config, by app name."""
    applications = serve_config.get("applications") or []
    if not applications:
        raise ValueError("the Serve config defines no applications")
    configs = {}
    for app in applications:
        name = app.get("name", "default")
        configs[name] = config = AppConfig.model_validate(app.get("args") or {})
        policy = app.get("autoscaling_policy")
        if config.queue_autoscaling:
            if not policy or policy.get("policy_function") != APP_POLICY:
                raise ValueError(f"app {name!r}: queue_autoscaling needs autoscaling_policy.policy_function {APP_POLICY}")
            QueueDurationAppPolicyConfig.model_validate(policy.get("policy_kwargs") or {})
    return configs
