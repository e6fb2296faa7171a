"""Moving a Ray session's processes off the engine workers' cores, on real processes, and
which processes are the session's, on a process tree of fakes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from serve_app.engine.cpu_cores import keep_off, session_processes, worker_cores

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


def test_the_session_is_what_the_raylet_started_not_its_parent(children):
    launcher = spawn("", CORES, below=("raylet", "replica"))
    children.append(launcher)
    raylet = psutil.Process(launcher.pid).children()[0]
    replica = raylet.children()[0]
    session = {process.pid for process in session_processes(replica)}
    assert session == {raylet.pid, replica.pid}
    assert session_processes(raylet) == []  # no raylet above it


SESSION = "/tmp/ray/session_2026-05-09_07-35-25_123456_42"


class FakeProcess:
    """The part of psutil.Process that finding a session reads."""

    def __init__(self, pid: int, cmdline: str, parent: FakeProcess | None = None):
        self.pid, self._cmdline, self._parent, self._children = pid, cmdline.split(), parent, []
        if parent is not None:
            parent._children.append(self)

    def name(self) -> str:
        return os.path.basename(self._cmdline[0])

    def cmdline(self) -> list[str]:
        return self._cmdline

    def parent(self) -> FakeProcess | None:
        return self._parent

    def parents(self) -> list[FakeProcess]:
        return [] if self._parent is None else [self._parent, *self._parent.parents()]

    def children(self, recursive: bool = False) -> list[FakeProcess]:
        return [grandchild for child in self._children
                for grandchild in [child, *(child.children(recursive=True) if recursive else [])]]


def test_under_a_daemonised_ray_start_only_the_session_is_moved():
    init = FakeProcess(1, "/sbin/init")  # a daemonised `ray start` leaves its processes to PID 1
    shell = FakeProcess(101, "bash", FakeProcess(100, "sshd", init))
    FakeProcess(102, f"tail -f {SESSION}/logs/raylet.out", shell)  # names the session, not started with it
    gcs = FakeProcess(200, f"/ray/gcs_server --session-dir={SESSION} --session-name={os.path.basename(SESSION)}", init)
    raylet = FakeProcess(300, f"/ray/raylet --temp_dir=/tmp/ray --session_dir={SESSION}", init)
    replica = FakeProcess(301, "ray::ServeReplica:llm:LLMServer", raylet)
    engine_core = FakeProcess(302, "VLLM::EngineCore", replica)
    worker = FakeProcess(303, "VLLM::Worker_TP0", engine_core)
    reaper = FakeProcess(304, "python -m serve_app.engine.reaper 301:1", replica)
    agent = FakeProcess(305, f"python dashboard/agent.py --session-dir={SESSION}", raylet)
    dashboard = FakeProcess(400, f"python dashboard/dashboard.py --temp-dir=/tmp/ray --session-dir={SESSION}", init)
    dashboard_module = FakeProcess(401, "ray-dashboard-StateHead", dashboard)
    monitor = FakeProcess(500, f"python autoscaler/_private/monitor.py --logs-dir={SESSION}/logs", init)
    FakeProcess(600, f"/ray/gcs_server --session-dir={SESSION}0", init)  # another session, its name longer
    FakeProcess(701, "ray::IDLE", FakeProcess(700, f"/ray/raylet --session_dir={SESSION}0", init))
    FakeProcess(800, "/usr/sbin/cron", init)
    session = session_processes(replica)
    assert sorted(process.pid for process in session) == sorted(process.pid for process in (
        raylet, replica, engine_core, worker, reaper, agent, gcs, dashboard, dashboard_module, monitor))
