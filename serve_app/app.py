"""Config -> Serve application: the one import path every config file names,
`import_path: serve_app.app:build_app`, and the only module of `serve_app` that
imports the Ray Serve deployment classes (`deployments`)."""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve import Application

from deployments.ingress import OpenAIIngress
from deployments.llm_server import LLMServer
from serve_app.config import AppConfig
from serve_app.topology import INGRESS_DEPLOYMENT, Topology


def build_app(args: dict[str, Any]) -> Application:
    """Called by `serve run` with the application's `args` from the config file."""
    return build_from_config(AppConfig.model_validate(args))


def build_from_config(config: AppConfig) -> Application:
    """One LLM deployment per (model, pool, capacity type), and the ingress over all of them."""
    topology = Topology(config)
    pools = {}
    for deployment in topology.deployments:
        model = config.model_by_name()[deployment.model]
        options = serve.deployment(LLMServer).options(name=deployment.name, **deployment.options)
        pools[deployment.name] = options.bind(model, deployment.pool, config.preemption)
    ingress = serve.deployment(serve.ingress()(OpenAIIngress))
    return ingress.options(name=INGRESS_DEPLOYMENT, **topology.ingress_options()).bind(config, pools)
