"""`make bench` reruns every committed result file with the command the file records,
so each README figure can be reproduced from one target."""

from __future__ import annotations

import json
import subprocess

from benchmarks.provenance import REPO


def recorded_command(path) -> str:
    data = json.loads(path.read_text())
    return (data.get("provenance") or {}).get("command") or data["command"]


def test_make_bench_runs_the_command_every_committed_result_file_records():
    planned = subprocess.run(["make", "-n", "bench"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    results = sorted((REPO / "benchmarks" / "results").glob("*.json"))
    assert results
    missing = [path.name for path in results if recorded_command(path) not in planned]
    assert not missing, f"make bench does not rerun {missing}"
    assert planned[-1] == ".venv/bin/python benchmarks/render_readme.py"
