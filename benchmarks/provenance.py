"""What every benchmark JSON records so that its figures can be traced: the git
commit (and whether the tree had uncommitted changes), the CPU model and the
flags that decide its dtype, the exact command line, and each system's settings.
Every writer goes through `benchmarks.report.write_json`, which adds this block.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from serve_app.engine.cpu_dtype import NATIVE_BF16_FLAGS, cpu_flags, resolve_cpu_dtype

REPO = Path(__file__).resolve().parent.parent
NOTABLE_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "avx_vnni", "fma")
"""CPU feature flags a result records: those that decide vLLM CPU's speed and dtype."""


def git_state(repo: Path = REPO, paths: Sequence[str] = ()) -> dict[str, Any]:
    """`git rev-parse HEAD` and whether tracked files (those under `paths`, when
    given) differ from it (None where git cannot tell)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no", *(["--", *paths] if paths else []))
    return {"commit": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_block(flags: frozenset[str] | None = None) -> dict[str, Any]:
    """The CPU model, core count, notable flags and whether bf16 is native."""
    flags = cpu_flags() if flags is None else flags
    return {"model": cpu_model(), "cpus": os.cpu_count(), "flags": [f for f in NOTABLE_FLAGS if f in flags],
            "native_bf16": bool(flags & NATIVE_BF16_FLAGS)}


def measured_on(cpu: Mapping[str, Any] | None = None) -> str:
    """One line: the CPU model, core count and its notable feature flags."""
    cpu = cpu_block() if cpu is None else cpu
    flags = " ".join(cpu["flags"]) or "none of " + "/".join(NOTABLE_FLAGS)
    return (f"{cpu['model']}, {cpu['cpus']} CPUs, flags: {flags} "
            f"({'native bf16' if cpu['native_bf16'] else 'no native bf16'})")


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "cpu": cpu_model(), "measured_on": measured_on(), "platform": platform.platform()}


def command_line() -> str:
    """How this benchmark was started, to rerun it (`-m module` kept; no machine path)."""
    return shlex.join([".venv/bin/python", *(portable(word) for word in sys.orig_argv[1:])])


def portable(word: str) -> str:
    """A command's word as a result file records it: a path in this checkout relative to
    it, a temporary file by its name under `<tmp>`, anything else as it is."""
    path = Path(word)
    if not path.is_absolute():
        return word
    if path.is_relative_to(REPO):
        return str(path.relative_to(REPO))
    return f"<tmp>/{path.name}" if path.is_relative_to(tempfile.gettempdir()) else word


def resolved_dtype(configured: str) -> str:
    """The dtype a CPU engine configured with `configured` computes in on this machine."""
    return resolve_cpu_dtype(configured, cpu_flags()).dtype


def provenance(systems: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The block every benchmark JSON carries: commit, CPU, command, dtypes and
    each system's settings (`benchmarks.settings.system_settings`)."""
    return {"git": git_state(), "cpu": cpu_block(), "command": command_line(),
            "dtype": sorted({str(s.get("dtype")) for s in systems.values()}),
            "systems": {name: dict(settings) for name, settings in systems.items()}}
