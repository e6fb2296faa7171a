"""The reaper kills what is left of a replica's process group once the replica is gone."""

import os
import signal
import subprocess
import sys
import time

import psutil

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
        killed = reaper.watch((replica.pid, psutil.Process(replica.pid).create_time()), poll_s=0.05)
        assert killed == [child] and time.monotonic() - started < 5
        replica.wait()


def test_a_replica_that_ended_cleanly_leaves_nothing_to_kill():
    from serve_app.engine.reaper import watch

    replica = subprocess.Popen([sys.executable, "-c", "pass"], process_group=0)
    started = psutil.Process(replica.pid).create_time()
    replica.wait()
    assert watch((replica.pid, started), poll_s=0.01) == []
