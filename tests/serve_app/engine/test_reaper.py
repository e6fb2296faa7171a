"""The reaper kills an engine's processes once the process that started them is gone."""

import os
import signal
import subprocess
import sys
import time

import psutil

from tests.conftest import REPO

STARTER = """
import subprocess, sys, time
import psutil
from serve_app.engine.reaper import start_reaper
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
start_reaper([psutil.Process(child.pid)])
print(child.pid, flush=True)
time.sleep(600)
"""


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_children_die_when_the_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", STARTER], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    child = int(parent.stdout.readline())
    assert psutil.pid_exists(child)
    time.sleep(1.0)  # the reaper is watching
    parent.send_signal(signal.SIGKILL)  # as a lost node or `ray stop --force` ends a replica
    parent.wait()
    assert wait_until(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE)


def test_the_reaper_leaves_when_its_children_end_on_their_own():
    from serve_app.engine.reaper import watch

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    me = psutil.Process()
    assert watch((me.pid, me.create_time()), [(child.pid, 0.0)], poll_s=0.01) == []


def test_the_watcher_returns_when_the_parent_ends_with_or_without_process_fds(monkeypatch):
    from serve_app.engine import reaper

    for use_fds in (True, False):
        if not use_fds:
            monkeypatch.delattr(reaper.os, "pidfd_open", raising=False)
        parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        started = time.monotonic()
        killed = reaper.watch((parent.pid, psutil.Process(parent.pid).create_time()),
                              [(child.pid, psutil.Process(child.pid).create_time())], poll_s=0.05)
        assert killed == [child.pid] and time.monotonic() - started < 5
        child.wait(timeout=5)
        parent.wait()
