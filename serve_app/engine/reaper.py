"""Ends an engine's processes when the replica that started them is gone.

vLLM runs its engine core and workers as child processes of the replica. A
replica that ends normally shuts them down (`LLMEngine.shutdown`), but one that
is killed (a lost node's actors, `ray stop --force`, a crash) leaves them
running and holding CPU and memory. So the replica starts this small watcher
beside them: it waits for the replica's process to end and then kills the
processes it was given (each checked by its start time, so a reused PID is
never hit). On Linux it blocks on process file descriptors and costs no CPU
while it waits; elsewhere it polls.

    python -m serve_app.engine.reaper PARENT_PID:START_TIME PID:START_TIME ...
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import psutil

POLL_S = 0.5
"""How often the watcher looks, where the OS has no process file descriptors."""


def _alive(pid: int, started: float) -> psutil.Process | None:
    try:
        process = psutil.Process(pid)
        same = abs(process.create_time() - started) < 0.01
        return process if same and process.status() != psutil.STATUS_ZOMBIE else None
    except psutil.NoSuchProcess:
        return None


def _open(pid: int, started: float) -> int | None:
    """A process file descriptor for the process, or None once it is gone (or its PID was reused)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    if _alive(pid, started) is None:  # checked after opening, so the descriptor holds the right process
        os.close(fd)
        return None
    return fd


def _wait_for_exits(parent: tuple[int, float], children: list[tuple[int, float]], poll_s: float) -> None:
    """Return once `parent` is gone or every child is."""
    if not hasattr(os, "pidfd_open"):
        while _alive(*parent) is not None and any(_alive(*child) for child in children):
            time.sleep(poll_s)
        return
    parent_fd = _open(*parent)
    if parent_fd is None:
        return
    child_fds = {fd for fd in (_open(*child) for child in children) if fd is not None}
    poller = select.poll()
    for fd in (parent_fd, *child_fds):
        poller.register(fd, select.POLLIN)
    try:
        remaining = set(child_fds)
        while remaining:
            for fd, _event in poller.poll():
                if fd == parent_fd:
                    return
                poller.unregister(fd)
                remaining.discard(fd)
    finally:
        for fd in (parent_fd, *child_fds):
            os.close(fd)


def watch(parent: tuple[int, float], children: list[tuple[int, float]], poll_s: float = POLL_S) -> list[int]:
    """Wait until `parent` is gone (or every child is); kill the children left. Returns their pids."""
    _wait_for_exits(parent, children, poll_s)
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
