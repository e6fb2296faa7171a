"""Ray Serve options of one deployment, passed through to `Deployment.options(...)`.

Only the options this app reads itself are typed here; every other key goes to
Serve as written and is validated by Serve's own models (`DeploymentSchema`,
`RayActorOptionsSchema`, `AutoscalingConfig`), so their defaults are Serve's.
Serve's models ignore unknown keys; this one refuses them, naming the key.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from ray.serve.config import AutoscalingConfig
from ray.serve.schema import DeploymentSchema, RayActorOptionsSchema

_SERVE_KEYS = {
    None: set(DeploymentSchema.model_fields) - {"name"},
    "ray_actor_options": set(RayActorOptionsSchema.model_fields),
    "autoscaling_config": set(AutoscalingConfig.model_fields),
}


class DeploymentOptions(BaseModel):
    """Ray Serve options of one deployment (`serve.deployment(...)` keywords)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    num_replicas: int | None = Field(default=None, gt=0)
    """Fixed replica count; leave unset when `autoscaling_config` is given
    (neither: one replica)."""
    autoscaling_config: dict[str, Any] | None = None
    """Serve `AutoscalingConfig` (min/max replicas, targets, delays)."""
    max_ongoing_requests: int = Field(default=64, gt=0)
    """Requests one replica runs at once: the ingress's slots per replica, at
    most the engine's `max_num_seqs` (more would wait inside the engine, unseen
    by the ingress's queue). Serve's own limit on a pool replica is set a
    little above the slots (`serve_app.topology.SERVE_HEADROOM`)."""

    @model_validator(mode="after")
    def _serve_accepts(self) -> DeploymentOptions:
        if self.num_replicas is not None and self.autoscaling_config is not None:
            raise ValueError("set either num_replicas or autoscaling_config, not both")
        options = self.model_dump(exclude_none=True)
        for section, known in _SERVE_KEYS.items():
            given = options if section is None else options.get(section) or {}
            unknown = sorted(set(given) - known)
            if unknown:
                where = f"{section}." if section else ""
                raise ValueError(f"unknown Serve option {where}{unknown[0]} (Serve takes: {', '.join(sorted(known))})")
        DeploymentSchema.model_validate({"name": "validation", **options})
        return self

    def serve_options(self) -> dict[str, Any]:
        """Keyword arguments for `Deployment.options(...)`: as given, with one
        replica when no count is set."""
        options = self.model_dump(exclude_none=True)
        if "num_replicas" not in options and "autoscaling_config" not in options:
            options["num_replicas"] = 1
        return options
