"""The project's one logging convention: every module logs to `logger_for(__name__)`,
a child of Serve's `ray.serve` logger, so lines from replicas and the controller
land in Serve's logs with their context and `serve run` shows them."""

from __future__ import annotations

import logging


def logger_for(module: str) -> logging.Logger:
    return logging.getLogger(f"ray.serve.{module}")
