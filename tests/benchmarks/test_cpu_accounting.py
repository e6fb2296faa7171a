"""CPU accounting: process groups from titles and command lines, and the
arithmetic of snapshot deltas (on fake /proc trees)."""

from __future__ import annotations

import os

import pytest

from benchmarks import cpu_accounting as cpu
from benchmarks.cpu_accounting import ProcInfo, Snapshot

VENV = "/work/main/.venv"
SAMPLES = {
    # this app under `serve run` (as seen on this machine)
    f"{VENV}/bin/python {VENV}/bin/serve run -a local /tmp/serve-run-x/local.yaml": "ray system",
    f"{VENV}/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp/ray": "ray system",
    f"{VENV}/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=x": "ray system",
    f"{VENV}/bin/python {VENV}/lib/python3.11/site-packages/ray/dashboard/dashboard.py --host=127.0.0.1": "ray system",
    f"{VENV}/bin/python -u {VENV}/lib/python3.11/site-packages/ray/_private/log_monitor.py --x": "ray system",
    f"{VENV}/bin/python -u {VENV}/lib/python3.11/site-packages/ray/autoscaler/_private/monitor.py": "ray system",
    "ray::DashboardAgent": "ray system",
    "ray::RuntimeEnvAgent": "ray system",
    "ray::ServeController.listen_for_change": "ray system",
    "ray::IDLE": "ray system",
    "ray::ProxyActor": "proxy",
    "ray::ServeReplica:llm:OpenAIIngress": "ingress",
    "ray::ServeReplica:llm:OpenAIIngress.handle_request": "ingress",
    "ray::ServeReplica:llm:LLMServer-smollm2-135m-instruct-default": "replica",
    "VLLM::EngineCore": "engine core",
    "VLLM::EngineCore_DP0": "engine core",
    "VLLM::Worker": "engine worker",
    "VLLM::Worker_TP1": "engine worker",
    # Ray Serve LLM
    f"{VENV}/bin/python /work/main/benchmarks/ray_serve_llm_app.py --config c.yaml --port 1": "ray system",
    "ray::ServeReplica:default:OpenAiIngress": "ingress",
    "ray::ServeReplica:default:LLMRouter": "ingress",
    "ray::ServeReplica:default:LLMServer:smollm2-135m-instruct": "replica",
    # vLLM's own server
    f"{VENV}/bin/python -m vllm.entrypoints.openai.api_server --model models/x --port 8001": "api server",
    "VLLM::APIServer_0": "api server",
    "/usr/sbin/haproxy -f /tmp/haproxy.cfg": "proxy",
}


@pytest.mark.parametrize(("cmdline", "group"), SAMPLES.items())
def test_classify_sample_command_lines(cmdline, group):
    assert cpu.classify(cmdline) == group


@pytest.mark.parametrize("cmdline", [f"{VENV}/bin/python -B -c from multiprocessing.resource_tracker import main",
                                     f"{VENV}/bin/python -m serve_app.engine.reaper 1:2", "bash", ""])
def test_helpers_are_unmatched_and_inherit_their_parent_group(cmdline):
    assert cpu.classify(cmdline) is None


def test_parse_stat_counts_fields_after_the_last_parenthesis():
    fields = ["S", "41"] + ["0"] * 9 + ["150", "50", "7", "9"] + ["0"] * 4 + ["123456"] + ["0"] * 10
    info = cpu.parse_stat(42, f"42 (we ird) (name) {' '.join(fields)}", "VLLM::Worker")
    assert (info.pid, info.ppid, info.cpu_ticks, info.start_ticks) == (42, 41, 200, 123456)  # utime + stime only


def proc(pid, ppid, cmdline, ticks=0, start=1000):
    return ProcInfo(pid, ppid, start, ticks, cmdline)


TREE = [
    proc(1, 0, "init"),
    proc(10, 1, "python benchmarks/throughput.py"),                      # the client
    proc(20, 10, f"{VENV}/bin/serve run -a local cfg.yaml"),             # the server root
    proc(21, 20, "/ray/gcs_server --x"), proc(22, 20, "/ray/raylet --x"),
    proc(30, 22, "ray::ServeReplica:llm:LLMServer-m-default"),
    proc(31, 30, "python -B -c from multiprocessing.resource_tracker import main"),
    proc(32, 30, "VLLM::EngineCore"), proc(33, 32, "VLLM::Worker"),
    proc(34, 30, "python -m serve_app.engine.reaper 30:1"),
    proc(40, 22, "ray::ServeReplica:llm:OpenAIIngress"), proc(41, 22, "ray::ProxyActor"),
    proc(50, 1, "VLLM::EngineCore"),                                      # someone else's engine
    proc(60, 10, "some unrelated child of the client"),
]


def test_group_tree_covers_the_servers_descendants_and_the_client_only():
    groups = {pid: group for (pid, _), group in cpu.group_tree(TREE, roots=[20], client_pid=10).items()}
    assert groups == {20: "ray system", 21: "ray system", 22: "ray system", 30: "replica", 31: "replica",
                      32: "engine core", 33: "engine worker", 34: "replica", 40: "ingress", 41: "proxy",
                      10: "client"}


def snap(entries):
    """{(pid, start): (ticks, group)} -> Snapshot."""
    return Snapshot({k: t for k, (t, _) in entries.items()}, {k: g for k, (_, g) in entries.items()})


def test_delta_counts_new_processes_from_zero_and_reused_pids_as_new():
    before = snap({(30, 1): (500, "replica"), (32, 1): (1000, "engine core"), (77, 1): (50, "replica"),
                   (10, 1): (20, "client"), (40, 1): (300, "ingress")})
    after = snap({(30, 1): (700, "replica"), (32, 1): (1900, "engine core"),
                  (33, 5): (400, "engine worker"),           # born during the window
                  (77, 9): (30, "replica"),                  # pid 77 reused by a new process
                  (10, 1): (45, "client"), (40, 1): (300, "ingress")})
    delta = cpu.cpu_delta(before, after, ticks_per_s=100)
    assert delta["cpu_s"]["replica"] == pytest.approx(2.0 + 0.3)
    assert delta["cpu_s"]["engine core"] == pytest.approx(9.0)
    assert delta["cpu_s"]["engine worker"] == pytest.approx(4.0)
    assert delta["cpu_s"]["client"] == pytest.approx(0.25)
    assert delta["cpu_s"]["ingress"] == 0.0 and delta["cpu_s"]["proxy"] == 0.0
    assert delta["exited"] == 1  # the old pid 77
    assert delta["processes"]["replica"] == 2


def test_window_report_per_1k_tokens_and_client_share(monkeypatch):
    monkeypatch.setattr(cpu, "TICKS_PER_S", 100)
    before = snap({(32, 1): (0, "engine core"), (10, 1): (0, "client")})
    after = snap({(32, 1): (1000, "engine core"), (10, 1): (40, "client")})
    report = cpu.window_report(before, after, output_tokens=2000, wall_s=10.0, cores=2)
    assert report["cpu_s_per_1k_output_tokens"]["engine core"] == pytest.approx(5.0)
    assert report["server_cpu_s"] == pytest.approx(10.0) and report["server_cpu_s_per_1k_output_tokens"] == 5.0
    assert report["client_machine_share"] == pytest.approx(0.4 / 20)
    assert report["machine_busy_share"] == pytest.approx(10.4 / 20)
    assert cpu.per_1k_tokens({"client": 1.0}, 0) == {"client": None}


def write_proc(root, pid, ppid, cmdline, utime, stime, start=100):
    (root / str(pid)).mkdir()
    fields = ["S", str(ppid)] + ["0"] * 9 + [str(utime), str(stime), "0", "0"] + ["0"] * 4 + [str(start)]
    (root / str(pid) / "stat").write_text(f"{pid} (x) {' '.join(fields)} 0 0\n")
    (root / str(pid) / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")


def test_snapshot_reads_a_proc_tree(tmp_path):
    write_proc(tmp_path, 5, 1, "python client.py", 3, 4)
    write_proc(tmp_path, 6, 5, "python -m vllm.entrypoints.openai.api_server --x", 100, 20)
    write_proc(tmp_path, 7, 6, "VLLM::EngineCore", 900, 100)
    write_proc(tmp_path, 8, 1, "VLLM::EngineCore", 5, 5)  # not ours
    (tmp_path / "self").mkdir()
    got = cpu.snapshot([6], client_pid=5, proc=tmp_path)
    assert got.ticks == {(5, 100): 7, (6, 100): 120, (7, 100): 1000}
    assert got.groups == {(5, 100): "client", (6, 100): "api server", (7, 100): "engine core"}


def test_snapshot_of_this_process_on_the_real_proc():
    got = cpu.snapshot([], client_pid=os.getpid())
    assert list(got.groups.values()) == ["client"] and next(iter(got.ticks.values())) >= 0
