"""An asyncio event loop whose clock is virtual: when nothing is ready to run,
time jumps to the next timer instead of waiting for it.

Code that reads time through the loop (`asyncio.sleep`, `asyncio.timeout`,
`loop.time()`, and the app's classes given `clock=loop.time`) then runs as it
would in real time, in the order real time would give, as fast as the CPU
allows. Nothing may wait on a thread or a socket: with no timer left and
nothing ready, the loop would wait forever, so it raises `Deadlock` instead.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Deadlock(RuntimeError):
    """Every task waits and no timer is left to wake one."""


class _VirtualSelector(selectors.DefaultSelector):
    """Never blocks: an idle wait of `timeout` seconds moves the clock instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            raise Deadlock("every task waits and no timer is left: the simulation cannot go on")
        self._loop.advance(timeout)
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a fresh virtual-time loop starting at 0."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)
