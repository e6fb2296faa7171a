"""`make bench` reruns every committed result file with the command the file records,
so each README figure can be reproduced from one target."""

from __future__ import annotations

import json
import os
import subprocess

from benchmarks.provenance import REPO


def recorded_command(path) -> str:
    data = json.loads(path.read_text())
    return (data.get("provenance") or {}).get("command") or data["command"]


def test_make_bench_runs_the_command_every_committed_result_file_records():
    # as a top-level make: under `make test` the inherited level would add "Entering directory" lines
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    planned = subprocess.run(["make", "--no-print-directory", "-n", "bench"], cwd=REPO, env=env,
                             capture_output=True, text=True, check=True).stdout.splitlines()
    results = sorted((REPO / "benchmarks" / "results").glob("*.json"))
    assert results
    missing = [path.name for path in results if recorded_command(path) not in planned]
    assert not missing, f"make bench does not rerun {missing}"
    assert planned[-1] == ".venv/bin/python benchmarks/render_readme.py"
