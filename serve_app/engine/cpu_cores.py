"""Keeps a machine's serving processes off the cores a CPU engine computes on.

vLLM CPU binds its worker's threads to cores of their own and reserves the rest
"for other processes", but nothing keeps those others off the worker's cores:
the Ray session's processes (GCS, raylet, Serve's proxy and controller, the
replicas, the engine core) float over every core and take turns with the
worker. So once its engine runs, a CPU replica moves every thread of its Ray
session on this machine, engine workers excepted, onto the other cores; no
process outside the session. Processes started later inherit that from the
raylet that forks them. Measured on a 2-core Xeon: the same running app made
298-336 output tok/s with them floating, 403-407 with them moved off (README;
the `serve run` driver, which now stays, moved too).
"""

from __future__ import annotations

import os

import psutil

ENGINE_WORKER_PREFIX = "VLLM::Worker"
"""Process title of vLLM's model workers (left where vLLM bound them)."""

RAYLET = "raylet"
"""Name of Ray's per-node daemon, which forks the session's workers."""

RAYLET_SESSION_DIR_FLAG = "--session_dir="
"""How the raylet is told its session's directory (`/tmp/ray/session_*`)."""


def _is_worker(process: psutil.Process) -> bool:
    try:
        return process.name().startswith(ENGINE_WORKER_PREFIX)
    except psutil.Error:
        return False


def _thread_cores(process: psutil.Process) -> set[int]:
    cores: set[int] = set()
    try:
        for thread in process.threads():
            cores |= os.sched_getaffinity(thread.id)
    except (psutil.Error, OSError):
        pass
    return cores


def worker_cores(engine_processes: list[psutil.Process]) -> set[int]:
    """The cores the engine's workers are bound to."""
    cores: set[int] = set()
    for process in engine_processes:
        if _is_worker(process):
            cores |= _thread_cores(process)
    return cores


def _session_dir(raylet: psutil.Process) -> str | None:
    for arg in raylet.cmdline():
        if arg.startswith(RAYLET_SESSION_DIR_FLAG):
            return arg.removeprefix(RAYLET_SESSION_DIR_FLAG)
    return None


def _names(process: psutil.Process, session_dir: str) -> bool:
    """Whether `session_dir`, or a path in it, is one of the process's arguments (as
    `--session-dir=DIR` or `--logs-dir=DIR/logs`)."""
    try:
        return any(value == session_dir or value.startswith(session_dir + os.sep)
                   for arg in process.cmdline() for value in arg.split("="))
    except psutil.Error:
        return False


def session_processes(replica: psutil.Process) -> list[psutil.Process]:
    """The processes of the replica's Ray session on this machine: its raylet, the
    raylet's siblings that name the session's directory in their arguments (GCS,
    dashboard, log monitor, autoscaler: who started the raylet started them), and
    everything those started. Not the raylet's parent: under a daemonised `ray start`
    that is PID 1 or whichever process adopted the session, and under `serve run` a
    driver that sleeps once it has deployed. Empty when the replica does not run
    under a raylet."""
    try:
        raylet = next((p for p in replica.parents() if p.name() == RAYLET), None)
        if raylet is None:
            return []
        roots = [raylet]
        session_dir, parent = _session_dir(raylet), raylet.parent()
        if session_dir is not None and parent is not None:
            roots += [p for p in parent.children() if p.pid != raylet.pid and _names(p, session_dir)]
        session = {}
        for root in roots:
            session.update((p.pid, p) for p in [root, *root.children(recursive=True)])
        return list(session.values())
    except psutil.Error:
        return []


def keep_off(cores: set[int], processes: list[psutil.Process]) -> int:
    """Move every thread of `processes` but engine workers' off `cores`, where
    another core is left to them. Returns how many threads moved."""
    moved = 0
    for process in processes:
        if _is_worker(process):
            continue
        try:
            for thread in process.threads():
                allowed = os.sched_getaffinity(thread.id)
                if allowed & cores and allowed - cores:
                    os.sched_setaffinity(thread.id, allowed - cores)
                    moved += 1
        except (psutil.Error, OSError):  # gone, or not ours to move
            continue
    return moved
