"""Ends an engine's processes when the replica that started them is gone.

vLLM runs its engine core and workers as child processes of the replica. A
replica that ends normally shuts them down (`LLMEngine.shutdown`), but one that
is killed (a lost node's actors, `ray stop --force`, a crash, a `serve shutdown`
that gives up on a replica still compiling) leaves them running and holding CPU
and memory. So before it starts the engine, the replica starts this small
watcher: it waits for the replica's process to end and then kills every
process still in the replica's process group (Ray starts each worker as the
leader of its own group, and vLLM's processes stay in it), those started before
the replica ended. It blocks on a process file descriptor and costs no CPU while
it waits (it polls where there are none).

A process is told by its pid and its start in clock ticks since boot (Linux's
/proc/<pid>/stat), which no step of the wall clock moves: a live replica never
looks dead and a reused pid is never hit. Where a start cannot be read the
watcher kills nothing. Other systems have no such count, so no watcher is
started there and a killed replica's engine outlives it.

    python -m serve_app.engine.reaper REPLICA_PID:START_TICKS
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

PROC = Path("/proc")

POLL_S = 0.5
"""How often the watcher looks, where there are no process file descriptors."""


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (field 22 of /proc/<pid>/stat);
    None when there is no such process or it has ended (a zombie). Raises OSError
    where that cannot be read."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the name in parentheses may hold spaces
    # fields[0] is field 3 (state): field n is fields[n - 3]
    return None if fields[0] in ("Z", "X") else int(fields[19])


def now_ticks() -> int:
    """Clock ticks since boot now, counted as `start_ticks` counts them."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def _alive(pid: int, started: int) -> bool:
    return start_ticks(pid) == started


def _wait_for_exit(pid: int, started: int, poll_s: float) -> None:
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


def _started_by(pid: int, tick: int) -> bool:
    started = start_ticks(pid)
    return started is not None and started <= tick


def live_processes(matches: Callable[[int], bool], started_by_tick: int | None = None) -> list[psutil.Process]:
    """Live processes (zombies excluded: their parents reap them) whose pid `matches`;
    with `started_by_tick` (a `now_ticks()`), only those started by then, and none
    whose start cannot be read."""
    found = []
    for process in psutil.process_iter():
        try:
            if (matches(process.pid) and process.status() != psutil.STATUS_ZOMBIE
                    and (started_by_tick is None or _started_by(process.pid, started_by_tick))):
                found.append(process)
        except (OSError, psutil.Error):
            continue
    return found


def watch(replica: tuple[int, int], poll_s: float = POLL_S) -> list[int]:
    """Wait until `replica` (its pid and `start_ticks`; a process-group leader) is gone;
    kill what is left of its group. Returns their pids. Raises OSError, having killed
    nothing, where the replica's start cannot be read."""
    _wait_for_exit(*replica, poll_s)
    ended = now_ticks()
    killed = []
    for process in live_processes(lambda pid: os.getpgid(pid) == replica[0], started_by_tick=ended):
        try:
            process.kill()
            killed.append(process.pid)
        except psutil.Error:
            continue
    return killed


def start_reaper() -> subprocess.Popen | None:
    """Start the watcher for this process's group, in a session of its own so a
    signal to the group does not take it along. Makes this process a group leader
    first if it is not one (Ray's workers already are), so the group is its own.
    None, starting nothing, off Linux (see the module's docstring)."""
    if not sys.platform.startswith("linux"):
        return None
    if os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)
    pid = os.getpid()
    return subprocess.Popen(
        [sys.executable, "-m", "serve_app.engine.reaper", f"{pid}:{start_ticks(pid)}"],
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


if __name__ == "__main__":
    pid, started = sys.argv[1].split(":")
    watch((int(pid), int(started)))
