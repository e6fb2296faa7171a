"""Config -> Serve application. The one import path every config file names:
`import_path: serve_app.builder:build_app`."""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve import Application

from deployments.llm_server import LLMServer
from deployments.router import OpenAIRouter
from serve_app.config import AppConfig


def deployment_name(model_name: str) -> str:
    return "LLMServer-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in model_name)


def build_app(args: dict[str, Any]) -> Application:
    """Called by `serve run` with the application's `args` from the config file."""
    config = AppConfig.model_validate(args)
    return build_from_config(config)


def build_from_config(config: AppConfig) -> Application:
    models = {
        model.name: serve.deployment(LLMServer)
        .options(name=deployment_name(model.name), **model.deployment.serve_options())
        .bind(model)
        for model in config.models
    }
    router = serve.deployment(serve.ingress()(OpenAIRouter)).options(
        name="OpenAIRouter", **config.router.deployment.serve_options()
    )
    return router.bind(config, models)
