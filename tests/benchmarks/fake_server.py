"""`tests/benchmarks/fake_openai.py` as a `LocalServer` child process."""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.servers import LocalServer

FAKE_OPENAI = Path(__file__).resolve().with_name("fake_openai.py")


class FakeServer(LocalServer):
    """A fake OpenAI chat server on loopback, started and stopped like the real ones."""

    label = "fake"

    def __init__(self, cwd: Path, **kwargs) -> None:
        super().__init__(cwd, **kwargs)
        self.model_name = "fake-model"

    def command(self) -> list[str]:
        return [sys.executable, str(FAKE_OPENAI), "--port", str(self.port)]
