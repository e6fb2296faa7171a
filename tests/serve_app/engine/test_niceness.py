"""A replica steps back behind its engine: every thread, never back up."""

import json
import os
import subprocess
import sys

from tests.conftest import REPO

SCRIPT = """
import json, os, threading, time
from serve_app.engine.niceness import step_back
started = threading.Event()
threading.Thread(target=lambda: (started.set(), time.sleep(5)), daemon=True).start()
started.wait()
child = os.fork()
if child == 0:  # stands for the engine, started before the replica steps back
    time.sleep(5); os._exit(0)
changed = step_back(7)
later = []
thread = threading.Thread(target=lambda: later.append(os.getpriority(os.PRIO_PROCESS, 0)))
thread.start(); thread.join()
again = step_back(3)
tids = [int(t) for t in os.listdir(f"/proc/{os.getpid()}/task")]
print(json.dumps({"changed": changed, "again": again, "later": later[0], "engine": os.getpriority(os.PRIO_PROCESS, child),
                  "threads": sorted({os.getpriority(os.PRIO_PROCESS, t) for t in tids})}))
os.kill(child, 9)
"""


def test_every_thread_steps_back_and_the_engine_does_not():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    result = json.loads(out.splitlines()[-1])
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert result["threads"] == [max(7, base)] and result["later"] == max(7, base)
    assert result["engine"] == base  # the engine's processes keep the replica's starting priority
    assert result["changed"] >= (2 if base < 7 else 0) and result["again"] == 0  # never lowered back
