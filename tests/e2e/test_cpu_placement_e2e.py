"""The shipped local app keeps its serving processes off the engine worker's cores."""

from __future__ import annotations

import os

import psutil
import pytest

pytestmark = pytest.mark.e2e


def processes_titled(prefix: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if " ".join(process.cmdline()).startswith(prefix):
                found.append(process)
        except psutil.Error:
            continue
    return found


def thread_cores(process: psutil.Process) -> set[int]:
    return set().union(*(os.sched_getaffinity(thread.id) for thread in process.threads()))


def test_serving_threads_stay_off_the_engine_workers_cores(live_app):
    workers = processes_titled("VLLM::Worker")
    assert workers, "no vLLM worker running"
    cores = set().union(*(thread_cores(worker) for worker in workers))
    if cores >= os.sched_getaffinity(0):
        pytest.skip(f"the workers are bound to every core this machine gives us ({sorted(cores)})")
    serving = processes_titled("ray::ServeReplica:llm:") + processes_titled("VLLM::EngineCore")
    assert len(serving) >= 3  # ingress, LLM replica, engine core
    for process in serving:
        assert not thread_cores(process) & cores, f"{process.cmdline()[0]} may run on the workers' cores {cores}"
