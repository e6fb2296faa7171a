"""Moving a node's processes off the engine workers' cores, on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from serve_app.engine.cpu_cores import keep_off, node_processes, worker_cores

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to move between")

CORES = sorted(os.sched_getaffinity(0))

CHILD = """
import os, subprocess, sys, threading, time, setproctitle
title, cores, below = sys.argv[1], sys.argv[2], sys.argv[3:]
if title:
    setproctitle.setproctitle(title)
os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
if below:  # a chain of descendants, titled as given; the last one prints "up"
    subprocess.Popen([sys.executable, "-c", os.environ["CHILD"], below[0], cores, *below[1:]]).wait()
print("up", flush=True)
time.sleep(60)
"""


def spawn(title: str, cores: list[int], below: tuple[str, ...] = ()) -> subprocess.Popen:
    """A sleeping process with two threads, bound to `cores`, with a chain of descendants titled `below`."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, title, ",".join(map(str, cores)), *below],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "CHILD": CHILD})
    assert child.stdout is not None and child.stdout.readline().strip() == "up"
    return child


def thread_cores(pid: int) -> list[set[int]]:
    return [os.sched_getaffinity(thread.id) for thread in psutil.Process(pid).threads()]


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for child in started:
        for grandchild in psutil.Process(child.pid).children(recursive=True):
            grandchild.kill()
        child.kill()
        child.wait()


def test_threads_leave_the_workers_cores_and_workers_stay(children):
    worker = spawn("VLLM::Worker_TP0", CORES[:1])
    server = spawn("", CORES)
    children += [worker, server]
    processes = [psutil.Process(worker.pid), psutil.Process(server.pid)]
    cores = worker_cores(processes)
    assert cores == {CORES[0]}
    moved = keep_off(cores, processes)
    assert moved == len(thread_cores(server.pid)) >= 2
    assert all(allowed == set(CORES[1:]) for allowed in thread_cores(server.pid))
    assert all(allowed == {CORES[0]} for allowed in thread_cores(worker.pid))


def test_a_process_with_nowhere_else_to_go_stays(children):
    pinned = spawn("", CORES[:1])
    children.append(pinned)
    assert keep_off({CORES[0]}, [psutil.Process(pinned.pid)]) == 0
    assert all(allowed == {CORES[0]} for allowed in thread_cores(pinned.pid))


def test_the_node_is_what_the_raylets_parent_started(children):
    launcher = spawn("", CORES, below=("raylet", "replica"))
    children.append(launcher)
    raylet = psutil.Process(launcher.pid).children()[0]
    replica = raylet.children()[0]
    node = {process.pid for process in node_processes(replica)}
    assert node == {launcher.pid, raylet.pid, replica.pid}
    assert node_processes(raylet) == []  # no raylet above it
