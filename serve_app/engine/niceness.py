"""Engine first: the replica steps back once its engine processes run.

A replica starts at nice 0 (`topology.REPLICA_ENV`) so that the engine core and
workers it spawns inherit 0, as under `vllm serve`. The replica itself then only
detokenizes and forwards, and on a small machine it competed with the engine
core's scheduling step for the same core: measured on 2 AVX2 cores, 32 streams,
79 output tok/s with the replica at 0 and 90 with it at 19. So once the engine
runs, every thread of the replica moves to Ray's worker niceness, where the
ingress, proxy and controller already are. Raising niceness needs no privilege.
"""

from __future__ import annotations

import os

from serve_app.logs import logger_for

logger = logger_for(__name__)

FRONTEND_NICENESS = 15
"""Niceness of a replica after its engine started: Ray's own worker default."""


def step_back(niceness: int = FRONTEND_NICENESS) -> int:
    """Raise every thread of this process to `niceness` (never lower it); returns
    the number of threads changed. On Linux niceness is per thread, and threads
    started later inherit it from the thread that starts them."""
    changed = 0
    tasks = f"/proc/{os.getpid()}/task"
    for tid in (int(name) for name in os.listdir(tasks)) if os.path.isdir(tasks) else [0]:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < niceness:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
                changed += 1
        except OSError:  # a thread that ended meanwhile
            continue
    logger.info("replica at niceness %d behind its engine (%d threads)", niceness, changed)
    return changed
