"""Inference engines behind one interface, chosen by a model's `backend`."""

from __future__ import annotations

from serve_app.config import ModelConfig
from serve_app.engine.base import LLMEngine


def create_engine(model: ModelConfig) -> LLMEngine:
    """Build (not start) the engine a model's config asks for."""
    if model.backend == "vllm":
        from serve_app.engine.vllm_engine import VLLMEngine

        return VLLMEngine(model.engine)
    raise ValueError(f"unknown engine backend {model.backend!r}")
