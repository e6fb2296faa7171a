"""Ends an engine's processes when the replica that started them is gone.

vLLM runs its engine core and workers as child processes of the replica. A
replica that ends normally shuts them down (`LLMEngine.shutdown`), but one that
is killed (a lost node's actors, `ray stop --force`, a crash) leaves them
running and holding CPU and memory. So the replica starts this small watcher
beside them: it polls the replica's process and, once it is gone, kills the
processes it was given (each checked by its start time, so a reused PID is
never hit).

    python -m serve_app.engine.reaper PARENT_PID:START_TIME PID:START_TIME ...
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

POLL_S = 0.5


def _alive(pid: int, started: float) -> psutil.Process | None:
    try:
        process = psutil.Process(pid)
        return process if abs(process.create_time() - started) < 0.01 else None
    except psutil.NoSuchProcess:
        return None


def watch(parent: tuple[int, float], children: list[tuple[int, float]], poll_s: float = POLL_S) -> list[int]:
    """Wait until `parent` is gone (or every child is); kill the children left. Returns their pids."""
    while _alive(*parent) is not None:
        if not any(_alive(*child) for child in children):
            return []
        time.sleep(poll_s)
    killed = []
    for pid, started in children:
        process = _alive(pid, started)
        if process is not None:
            process.kill()
            killed.append(pid)
    return killed


def start_reaper(children: list[psutil.Process]) -> subprocess.Popen:
    """Start the watcher for this process's `children`, in its own session so a
    signal to the replica's process group does not take it along."""
    me = psutil.Process()
    args = [f"{child.pid}:{child.create_time()!r}" for child in children]
    return subprocess.Popen(
        [sys.executable, "-m", "serve_app.engine.reaper", f"{me.pid}:{me.create_time()!r}", *args],
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def _pair(text: str) -> tuple[int, float]:
    pid, started = text.split(":")
    return int(pid), float(started)


if __name__ == "__main__":
    watch(_pair(sys.argv[1]), [_pair(arg) for arg in sys.argv[2:]])
