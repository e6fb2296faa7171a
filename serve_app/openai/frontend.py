"""vLLM's own OpenAI layer for one served model, over the app's scheduler.

`vllm serve` builds its serving classes (chat, completions, responses,
tokenization, models) with `init_app_state` around an engine. The ingress
builds the same ones around a `RoutedEngineClient`, so requests are rendered,
checked and answered exactly as `vllm serve` does, and only `generate` goes
through the app (prediction, admission, pools, resume).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serve_app.config import ModelConfig
from serve_app.engine.cpu_dtype import engine_kwargs_here
from serve_app.logs import logger_for
from serve_app.openai.routed_engine import RoutedEngineClient

logger = logger_for(__name__)


@dataclass(frozen=True)
class ModelFrontend:
    """The serving objects `vllm serve` would hold for one model."""

    name: str
    state: Any
    """Starlette `State` filled by vLLM's `init_app_state` (`openai_serving_chat`,
    `openai_serving_completion`, `openai_serving_responses`,
    `serving_tokenization`, `openai_serving_models`, `args`); None when vLLM
    refused the model's config."""
    refused: str | None = None
    """Why vLLM refused the model's config (its replicas cannot start either):
    the model's requests get 503, the other models are served."""


def frontend_args(model: ModelConfig) -> list[str]:
    """The `vllm serve` command line whose frontend this model gets."""
    args = ["--model", model.engine.model, "--served-model-name", model.name]
    if model.tool_call_parser is not None:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", model.tool_call_parser]
    return args


async def build_frontend(model: ModelConfig) -> ModelFrontend:
    """vLLM's serving objects for `model` (about 2 s: config and tokenizer, no weights)."""
    from starlette.datastructures import State
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        vllm_config = AsyncEngineArgs(**engine_kwargs_here(model.engine), disable_log_stats=True).create_engine_config()
    except Exception as exc:  # noqa: BLE001 - vLLM refuses configs with many exception types
        logger.error("model %s: vLLM refuses its engine config: %s", model.name, exc)
        return ModelFrontend(model.name, None, refused=f"{type(exc).__name__}: {exc}"[:300])
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(frontend_args(model))
    state = State()
    await init_app_state(RoutedEngineClient(vllm_config), state, args, supported_tasks=("generate",))
    return ModelFrontend(model.name, state)
