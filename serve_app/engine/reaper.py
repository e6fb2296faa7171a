"""Ends an engine's processes when the replica that started them is gone.

vLLM runs its engine core and workers as child processes of the replica. A
replica that ends normally shuts them down (`LLMEngine.shutdown`), but one that
is killed (a lost node's actors, `ray stop --force`, a crash, a `serve shutdown`
that gives up on a replica still compiling) leaves them running and holding CPU
and memory. So before it starts the engine, the replica starts this small
watcher: it waits for the replica's process to end and then kills every
process still in the replica's process group (Ray starts each worker as the
leader of its own group, and vLLM's processes stay in it), those created before
the replica ended, so a reused PID is never hit. On Linux it blocks on a process
file descriptor and costs no CPU while it waits; elsewhere it polls.

    python -m serve_app.engine.reaper REPLICA_PID:START_TIME
"""

from __future__ import annotations

import math
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable

import psutil

POLL_S = 0.5
"""How often the watcher looks, where the OS has no process file descriptors."""


def _alive(pid: int, started: float) -> bool:
    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - started) < 0.01 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for_exit(pid: int, started: float, poll_s: float) -> None:
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:
            if _alive(pid, started):  # checked after opening, so the descriptor holds the right process
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                poller.poll()
        finally:
            os.close(fd)
        return
    while _alive(pid, started):
        time.sleep(poll_s)


def live_processes(matches: Callable[[int], bool], created_before: float = math.inf) -> list[psutil.Process]:
    """Live processes (zombies excluded: their parents reap them) whose pid `matches`,
    created before `created_before` (a time.time())."""
    found = []
    for process in psutil.process_iter():
        try:
            if (matches(process.pid) and process.create_time() < created_before
                    and process.status() != psutil.STATUS_ZOMBIE):
                found.append(process)
        except (OSError, psutil.Error):
            continue
    return found


def watch(replica: tuple[int, float], poll_s: float = POLL_S) -> list[int]:
    """Wait until `replica` (its pid and start time; a process-group leader) is gone;
    kill what is left of its group. Returns their pids."""
    _wait_for_exit(*replica, poll_s)
    ended = time.time()
    killed = []
    for process in live_processes(lambda pid: os.getpgid(pid) == replica[0], created_before=ended):
        try:
            process.kill()
            killed.append(process.pid)
        except psutil.Error:
            continue
    return killed


def start_reaper() -> subprocess.Popen:
    """Start the watcher for this process's group, in a session of its own so a
    signal to the group does not take it along. Makes this process a group leader
    first if it is not one (Ray's workers already are), so the group is its own."""
    if os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)
    me = psutil.Process()
    return subprocess.Popen(
        [sys.executable, "-m", "serve_app.engine.reaper", f"{me.pid}:{me.create_time()!r}"],
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


if __name__ == "__main__":
    pid, started = sys.argv[1].split(":")
    watch((int(pid), float(started)))
