"""The autoscaling policy entry that Serve configs name (`APP_POLICY`).

Serve cloudpickles the module of `policy_function` by value, and pydantic
models rebuilt that way fail in the controller (Ray 2.60, pydantic 2:
`SchemaError` on unpickling). So this module refers to nothing else in the
project and imports the policy by name when the controller instantiates it.
"""

from __future__ import annotations

import importlib
from typing import Any


class RayAppPolicy:
    """A shim over `serve_app.autoscaling.ray_adapter.QueueDurationAppPolicy`."""

    def __init__(self, **policy_kwargs: Any) -> None:
        module = importlib.import_module("serve_app.autoscaling.ray_adapter")
        self._policy = module.QueueDurationAppPolicy(**policy_kwargs)

    def __call__(self, contexts):
        return self._policy(contexts)
