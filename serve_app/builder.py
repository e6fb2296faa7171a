"""Config -> Serve application. The one import path every config file names:
`import_path: serve_app.builder:build_app`."""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve import Application

from deployments.llm_server import LLMServer
from deployments.request_router import ROUTER_CONFIG
from deployments.router import ROUTER_DEPLOYMENT, OpenAIRouter
from serve_app.autoscaling import router_autoscaling_config
from serve_app.config import AppConfig, pool_deployment_name


def build_app(args: dict[str, Any]) -> Application:
    """Called by `serve run` with the application's `args` from the config file."""
    config = AppConfig.model_validate(args)
    return build_from_config(config)


def build_from_config(config: AppConfig) -> Application:
    """One LLM deployment per (model, pool, capacity type), and the router over all of them."""
    pools = {}
    for model in config.models:
        for pool in model.pools:
            for capacity_type, options in config.pool_deployments(model, pool).items():
                name = pool_deployment_name(model.name, pool.name, capacity_type)
                options = {"request_router_config": ROUTER_CONFIG, **options}
                deployment = serve.deployment(LLMServer).options(name=name, **options)
                pools[name] = deployment.bind(model, pool.name, config.preemption)
    router_options = config.router.deployment.serve_options()
    if config.queue_autoscaling and "num_replicas" in router_options:
        # Serve asks only autoscaling deployments for their stats: a fixed-size "autoscaling" router.
        router_options["autoscaling_config"] = router_autoscaling_config(router_options.pop("num_replicas"))
    router = serve.deployment(serve.ingress()(OpenAIRouter)).options(name=ROUTER_DEPLOYMENT, **router_options)
    return router.bind(config, pools)
