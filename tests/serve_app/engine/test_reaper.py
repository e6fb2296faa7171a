"""The reaper kills what is left of a replica's process group once the replica is gone."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO

STARTER = """
import subprocess, sys, time
from serve_app.engine.reaper import start_reaper
start_reaper()  # as the replica does, before its engine exists
sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
spawner = "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(600)"
child = subprocess.Popen([sys.executable, "-c", spawner, *sleeper])  # an engine core and its worker
outsider = subprocess.Popen(sleeper, start_new_session=True)  # left the group on purpose
time.sleep(1.0)
print(child.pid, outsider.pid, flush=True)
time.sleep(600)
"""


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_the_replicas_group_dies_with_it_and_nothing_else():
    replica = subprocess.Popen([sys.executable, "-c", STARTER], cwd=REPO, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    child, outsider = (int(pid) for pid in replica.stdout.readline().split())
    grandchild = psutil.Process(child).children()[0].pid
    assert os.getpgid(child) == os.getpgid(grandchild) == replica.pid  # the starter leads its own group now
    replica.send_signal(signal.SIGKILL)  # as a lost node or `ray stop --force` ends a replica
    replica.wait()
    assert wait_until(lambda: gone(child) and gone(grandchild))  # the grandchild was reparented, and still found
    assert not gone(outsider)
    os.kill(outsider, signal.SIGKILL)


def test_the_watcher_returns_when_the_replica_ends_with_or_without_process_fds(monkeypatch):
    from serve_app.engine import reaper

    leader = ("import subprocess, sys, time; "
              "print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']).pid, flush=True); "
              "time.sleep(1)")
    for use_fds in (True, False):
        if not use_fds:
            monkeypatch.delattr(reaper.os, "pidfd_open", raising=False)
        replica = subprocess.Popen([sys.executable, "-c", leader], process_group=0, stdout=subprocess.PIPE, text=True)
        child = int(replica.stdout.readline())
        started = time.monotonic()
        killed = reaper.watch((replica.pid, reaper.start_ticks(replica.pid)), poll_s=0.05)
        assert killed == [child] and time.monotonic() - started < 5
        replica.wait()


def test_a_replica_that_ended_cleanly_leaves_nothing_to_kill():
    from serve_app.engine.reaper import start_ticks, watch

    replica = subprocess.Popen([sys.executable, "-c", "pass"], process_group=0)
    started = start_ticks(replica.pid)
    replica.wait()
    assert watch((replica.pid, started), poll_s=0.01) == []


CLOCK = """
import os, select, sys
import psutil._pslinux

def in_reaper():
    return sys.argv[0].endswith(os.path.join("engine", "reaper.py"))

def stepped_boot_time(real=psutil._pslinux.boot_time, step=os.environ["CLOCK_STEP"]):
    return real() + (float(open(step).read()) if in_reaper() and os.path.exists(step) else 0.0)

class NoticedPoll:
    def __init__(self, real=select.poll):
        self.poller = real()
    def register(self, *args):
        self.poller.register(*args)
    def poll(self, *args):
        if in_reaper():
            open(os.environ["WAITING"], "w").close()
        return self.poller.poll(*args)

psutil._pslinux.boot_time = stepped_boot_time  # psutil adds it to every process's start for create_time
select.poll = NoticedPoll
"""
"""A sitecustomize for a replica and its reaper: in the reaper, the wall clock steps by the
seconds in the file CLOCK_STEP once that exists (psutil derives create_time from a boot time
it re-reads, and that moves with the wall clock), and the file WAITING appears once the
reaper blocks waiting for the replica to end."""

REPLICA = """
import subprocess, sys
from serve_app.engine.reaper import start_reaper
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # an engine core
print(child.pid, flush=True)
start_reaper()
sys.stdin.read()
"""


class Replica:
    """A replica (a process-group leader) with an engine child and its reaper, under CLOCK."""

    def __init__(self, folder: Path):
        (folder / "sitecustomize.py").write_text(CLOCK)
        self.clock_step, self.waiting = folder / "step", folder / "waiting"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(REPO)]),
               "CLOCK_STEP": str(self.clock_step), "WAITING": str(self.waiting)}
        self.process = subprocess.Popen([sys.executable, "-c", REPLICA], cwd=REPO, env=env, process_group=0,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.child = int(self.process.stdout.readline())

    def step_clock(self, seconds: float) -> None:
        self.clock_step.write_text(str(seconds))

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def replica(tmp_path) -> Iterator[Replica]:
    started = Replica(tmp_path)
    yield started
    started.kill()
    if not gone(started.child):
        os.kill(started.child, signal.SIGKILL)


def test_a_wall_clock_step_leaves_a_live_replica_and_its_group_alone(replica):
    replica.step_clock(0.02)
    assert wait_until(lambda: replica.waiting.exists() or gone(replica.process.pid))
    assert not gone(replica.process.pid) and not gone(replica.child)
    replica.kill()
    assert wait_until(lambda: gone(replica.child))


def test_a_wall_clock_step_after_the_replica_ends_spares_nothing_it_left(replica):
    assert wait_until(replica.waiting.exists)
    replica.step_clock(60.0)  # leftovers now look started after the replica ended, to a wall clock
    replica.kill()
    assert wait_until(lambda: gone(replica.child))


def test_a_start_that_cannot_be_read_kills_nothing(monkeypatch):
    from serve_app.engine import reaper

    leader = ("import subprocess, sys; "
              "print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']).pid, flush=True); "
              "sys.stdin.read()")
    replica = subprocess.Popen([sys.executable, "-c", leader], process_group=0, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    child = int(replica.stdout.readline())
    started = reaper.start_ticks(replica.pid)

    def unreadable(pid: int) -> int:
        raise PermissionError(pid)

    monkeypatch.setattr(reaper, "start_ticks", unreadable)
    with pytest.raises(PermissionError):  # is the replica alive? unknown: the watcher ends
        reaper.watch((replica.pid, started), poll_s=0.01)
    replica.kill()
    replica.wait()
    assert reaper.watch((replica.pid, started), poll_s=0.01) == []  # what is left has no known start
    assert not gone(child)
    os.kill(child, signal.SIGKILL)
