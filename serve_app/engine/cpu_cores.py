"""Keeps a machine's serving processes off the cores a CPU engine computes on.

vLLM CPU binds its worker's threads to cores of their own and reserves the rest
"for other processes", but nothing keeps those others off the worker's cores:
the Ray node's processes (GCS, raylet, Serve's proxy and controller, the
replicas, the engine core) float over every core and take turns with the
worker. So once its engine runs, a CPU replica moves every thread of its Ray
node, engine workers excepted, onto the other cores. Processes started later
inherit that from the raylet that forks them. Measured on a 2-core Xeon: the
same running app made 298-336 output tok/s with them floating, 403-407 with
them moved off (README).
"""

from __future__ import annotations

import os

import psutil

ENGINE_WORKER_PREFIX = "VLLM::Worker"
"""Process title of vLLM's model workers (left where vLLM bound them)."""


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


def node_processes(replica: psutil.Process) -> list[psutil.Process]:
    """The processes of the replica's Ray node: everything started by whoever
    started its raylet (`serve run`, `ray start`), that one included. Empty
    when the replica does not run under a raylet."""
    try:
        raylet = next((p for p in replica.parents() if p.name() == "raylet"), None)
        root = raylet.parent() if raylet is not None else None
        return [] if root is None else [root, *root.children(recursive=True)]
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
