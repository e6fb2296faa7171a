"""Inference engines behind one interface, chosen by a model's `backend`."""

from __future__ import annotations

from serve_app.config import EngineConfig
from serve_app.engine.base import LLMEngine


def create_engine(backend: str, engine: EngineConfig) -> LLMEngine:
    """Build (not start) the engine a pool's config asks for."""
    if backend == "vllm":
        from serve_app.engine.vllm_engine import VLLMEngine

        return VLLMEngine(engine)
    raise ValueError(f"unknown engine backend {backend!r}")
