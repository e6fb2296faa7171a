"""CPU-seconds per process group over a measured window, from /proc.

A snapshot reads utime + stime (clock ticks, /proc/<pid>/stat fields 14-15) of
the system under test (every descendant of the server process, found through
the parent pids) and of the benchmark process itself. The delta of two
snapshots is each process's CPU time within the window; a process born during
the window counts from 0, one that exited during it is lost (counted in
`exited`, its time unknown). A process is keyed by (pid, start time), so a
reused pid is a new process.

Groups, by the process title (setproctitle: vLLM's `VLLM::<name>`, Ray's
`ray::<actor>`) or command line:

- `engine worker`: `VLLM::Worker*` (vLLM's model runner process);
- `engine core`: `VLLM::EngineCore*` (the scheduler loop);
- `replica`: a Serve replica that holds an engine client:
  `ray::ServeReplica:<app>:LLMServer*` (this app's `LLMServer-<model>-<pool>`
  and Ray Serve LLM's `LLMServer:<model>`, which also serves HTTP there);
- `ingress`: a Serve replica routing HTTP to the engines: this app's
  `OpenAIIngress`, Ray Serve LLM's `OpenAiIngress` and `LLMRouter`;
- `proxy`: Serve's HTTP proxy (`ray::ProxyActor`, or HAProxy);
- `ray system`: raylet, gcs_server, the dashboard and its agents, log
  monitor, autoscaler monitor, every other `ray::` process (ServeController,
  idle workers), the `serve run` CLI and the Ray Serve LLM driver script;
- `api server`: vLLM's own OpenAI server process (HTTP, tokenizer, detokenizer
  and engine client in one process, `vllm.entrypoints.openai.api_server` or
  `VLLM::APIServer*`). Decided: Ray Serve LLM's replicas are NOT put here but in
  `replica`/`ingress` by role, so each group compares like with like;
- `client`: the benchmark process (all its threads);
- `other`: anything unmatched whose parent is unmatched too. An unmatched
  helper (multiprocessing's resource tracker, this app's engine reaper) takes
  its parent's group.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

GROUPS = ("engine worker", "engine core", "replica", "ingress", "proxy", "ray system", "api server", "client",
          "other")
CLIENT = "client"
PROC = Path("/proc")
TICKS_PER_S = os.sysconf("SC_CLK_TCK")

_REPLICA = re.compile(r"ray::ServeReplica:[^:\s]*:(?P<deployment>\S+)")
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("engine worker", re.compile(r"^VLLM::Worker")),
    ("engine core", re.compile(r"^VLLM::EngineCore")),
    ("api server", re.compile(r"^VLLM::APIServer|vllm\.entrypoints\.openai\.api_server|"
                              r"vllm\.entrypoints\.cli\.main serve|/vllm serve\b|^vllm serve\b")),
    ("proxy", re.compile(r"^ray::ProxyActor|(^|/)haproxy\b")),
    ("ray system", re.compile(r"^ray::|/raylet\b|/gcs_server\b|dashboard/dashboard\.py|dashboard/agent\.py|"
                              r"_private/log_monitor\.py|autoscaler/_private/monitor\.py|runtime_env/agent|"
                              r"/bin/serve run\b|(^|\s)serve run\b|ray_serve_llm_app\.py")),
)


def classify(cmdline: str) -> str | None:
    """The group of a process by its title or command line; None: unmatched."""
    replica = _REPLICA.match(cmdline)
    if replica:
        deployment = replica.group("deployment")
        if deployment.startswith("LLMServer"):
            return "replica"
        if deployment.lower().startswith(("openaiingress", "llmrouter")):
            return "ingress"
        return "other"
    for group, pattern in _RULES:
        if pattern.search(cmdline):
            return group
    return None


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    start_ticks: int
    """Start time after boot, in clock ticks (tells a reused pid apart)."""
    cpu_ticks: int
    """utime + stime."""
    cmdline: str


def parse_stat(pid: int, stat: str, cmdline: str) -> ProcInfo:
    """A /proc/<pid>/stat line (the command name in parentheses may hold spaces
    and parentheses: fields are counted after the last `)`)."""
    fields = stat[stat.rindex(")") + 2:].split()
    # fields[0] is field 3 (state): field n is fields[n - 3]
    return ProcInfo(pid, int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12]), cmdline)


def read_proc(pid: int, proc: Path = PROC) -> ProcInfo | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return parse_stat(pid, stat, cmdline)


def all_processes(proc: Path = PROC) -> list[ProcInfo]:
    infos = (read_proc(int(entry.name), proc) for entry in proc.iterdir() if entry.name.isdigit())
    return [info for info in infos if info is not None]


Key = tuple[int, int]
"""(pid, start ticks)."""


@dataclass(frozen=True)
class Snapshot:
    ticks: dict[Key, int]
    groups: dict[Key, str]


def group_tree(processes: Iterable[ProcInfo], roots: Iterable[int], client_pid: int) -> dict[Key, str]:
    """The group of `client_pid` and of every descendant of `roots` (roots
    included); unmatched processes take their parent's group."""
    by_pid = {p.pid: p for p in processes}
    children: dict[int, list[ProcInfo]] = defaultdict(list)
    for p in by_pid.values():
        children[p.ppid].append(p)
    groups: dict[Key, str] = {}
    stack = [(by_pid[r], None) for r in roots if r in by_pid and r != client_pid]
    while stack:
        info, parent_group = stack.pop()
        group = classify(info.cmdline) or parent_group or "other"
        groups[(info.pid, info.start_ticks)] = group
        stack += [(child, group) for child in children.get(info.pid, []) if child.pid != client_pid]
    if client_pid in by_pid:
        groups[(client_pid, by_pid[client_pid].start_ticks)] = CLIENT
    return groups


def snapshot(roots: Iterable[int], client_pid: int | None = None, proc: Path = PROC) -> Snapshot:
    """CPU ticks now of the client and of `roots` with all their descendants."""
    processes = all_processes(proc)
    groups = group_tree(processes, roots, os.getpid() if client_pid is None else client_pid)
    ticks = {(p.pid, p.start_ticks): p.cpu_ticks for p in processes if (p.pid, p.start_ticks) in groups}
    return Snapshot(ticks, groups)


def cpu_delta(before: Snapshot, after: Snapshot, ticks_per_s: int = TICKS_PER_S) -> dict[str, object]:
    """CPU-seconds per group between two snapshots (groups as `after` sees them)."""
    seconds = dict.fromkeys(GROUPS, 0.0)
    processes: dict[str, int] = dict.fromkeys(GROUPS, 0)
    for key, ticks in after.ticks.items():
        group = after.groups[key]
        seconds[group] += max(0, ticks - before.ticks.get(key, 0)) / ticks_per_s
        processes[group] += 1
    exited = sum(key not in after.ticks for key in before.ticks)
    return {"cpu_s": seconds, "processes": processes, "exited": exited}


def per_1k_tokens(cpu_s: dict[str, float], output_tokens: int) -> dict[str, float | None]:
    """CPU-seconds per 1000 output tokens, per group (None without tokens)."""
    return {group: (value * 1000 / output_tokens if output_tokens else None) for group, value in cpu_s.items()}


def window_report(before: Snapshot, after: Snapshot, output_tokens: int, wall_s: float,
                  cores: int | None = None) -> dict[str, object]:
    """Everything the benchmarks record about one window's CPU use."""
    delta = cpu_delta(before, after)
    cpu_s: dict[str, float] = delta["cpu_s"]  # type: ignore[assignment]
    cores = cores or os.cpu_count() or 1
    server = sum(v for g, v in cpu_s.items() if g != CLIENT)
    return {
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "cpu_s_per_1k_output_tokens": per_1k_tokens(cpu_s, output_tokens),
        "server_cpu_s": server,
        "server_cpu_s_per_1k_output_tokens": server * 1000 / output_tokens if output_tokens else None,
        "client_machine_share": cpu_s[CLIENT] / (wall_s * cores) if wall_s > 0 else None,
        "machine_busy_share": (server + cpu_s[CLIENT]) / (wall_s * cores) if wall_s > 0 else None,
        "processes": delta["processes"],
        "exited_during_window": delta["exited"],
    }
