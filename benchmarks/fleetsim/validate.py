"""Replay a measured benchmark's workload through the simulator and compare.

    .venv/bin/python -m benchmarks.fleetsim.validate     # seconds; writes benchmarks/results/fleetsim_validation.{json,png}

The throughput benchmark's workload (`benchmarks/results/throughput.json`:
its requests, concurrency, `max_tokens`, prompts and warmup) runs through
the app's real batcher over one simulated engine, and through `vllm serve`
modelled as the engine alone, both with the step time fitted on this machine
(`benchmarks/results/step_profile.json`). Each metric's error is
(simulated - measured) / measured, against the measured median of the
repeats. Targets: at most 10% on output tok/s and p50 latencies, 20% on p99.

Not modelled, so in the error: the ingress, Serve's proxy, the HTTP client
and the CPU they take from the engine's machine; prefix caching.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks import metrics
from benchmarks.fleetsim import virtual_time
from benchmarks.fleetsim.fleet import LeastLoadedRouter
from benchmarks.fleetsim.simulate import SimApp, SimRequest, VllmServeSim, closed_loop
from benchmarks.fleetsim.step_time import LinearStepTime
from benchmarks.provenance import command_line
from benchmarks.report import dig, write_json
from serve_app.config import AppConfig
from serve_app.config.app import app_configs, load_serve_config

METRICS = {  # name in the simulated summary -> (name in the measured result, target error)
    "output_throughput": ("output_tok_per_s", 0.10),
    "ttft_s.p50": ("ttft_p50_s", 0.10),
    "tpot_s.p50": ("tpot_p50_s", 0.10),
    "e2el_s.p50": ("e2el_p50_s", 0.10),
    "ttft_s.p99": ("ttft_p99_s", 0.20),
    "e2el_s.p99": ("e2el_p99_s", 0.20),
}


def story_requests(count: int, max_tokens: int, model_dir: str) -> list[SimRequest]:
    """The throughput benchmark's requests (`benchmarks/throughput.py`'s `body`), with
    their prompt tokens as the model's chat template renders them."""
    from transformers import AutoTokenizer

    from benchmarks.throughput import body

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    requests = []
    for index in range(count):
        messages = body("", index, max_tokens)["messages"]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        requests.append(SimRequest(len(prompt), max_tokens, max_tokens, (("user", messages[0]["content"]),),
                                   ignore_eos=True))
    return requests


async def replay(system: str, config: AppConfig, step_time: LinearStepTime, workload: dict[str, Any],
                 stream_interval: int, requests: list[SimRequest]) -> dict[str, Any]:
    app = (SimApp(config, step_time, LeastLoadedRouter()) if system == "app"
           else VllmServeSim(config, step_time, stream_interval))
    await closed_loop(app, requests[: workload["warmup_requests"]], workload["concurrency"])
    records, duration = await closed_loop(app, requests, workload["concurrency"])
    return metrics.summarize(records, duration)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", default="benchmarks/results/throughput.json")
    parser.add_argument("--profile", default="benchmarks/results/step_profile.json")
    parser.add_argument("--out", default="benchmarks/results/fleetsim_validation")
    args = parser.parse_args()
    measured = json.loads(Path(args.measured).read_text())
    step_time = LinearStepTime.load(Path(args.profile))
    (config,) = app_configs(load_serve_config(measured["config"])).values()
    workload = measured["workload"]
    requests = story_requests(workload["requests"], workload["max_tokens"], config.models[0].engine.model)
    interval = int(measured["provenance"]["systems"]["vllm"]["stream_interval"])
    comparison: dict[str, dict[str, Any]] = {}
    for result in measured["results"]:
        system = result["target"]
        simulated = virtual_time.run(replay(system, config, step_time, workload, interval, requests))
        rows = {}
        for path, (measured_name, limit) in METRICS.items():
            value, truth = dig(simulated, path), result["stats"][measured_name]["median"]
            error = (value - truth) / truth
            rows[measured_name] = {"measured": truth, "simulated": value, "error": error, "target": limit,
                                   "pass": abs(error) <= limit}
            print(f"[validate] {system:5} {measured_name:17} measured {truth:8.4g} simulated {value:8.4g} "
                  f"error {error:+.1%} ({'PASS' if abs(error) <= limit else 'MISS'} at {limit:.0%})")
        comparison[system] = rows
    result = {"benchmark": "fleetsim_validation", "command": command_line(), "measured": args.measured,
              "measured_commit": measured["provenance"]["git"]["commit"], "step_time": step_time.__dict__,
              "workload": workload, "comparison": comparison,
              "not_modelled": "ingress, Serve's proxy, HTTP client and their CPU; prefix caching"}
    profiled = json.loads(Path(args.profile).read_text())["engine"]["dtype_resolved"]
    write_json(Path(f"{args.out}.json"), result, {"simulator": {"dtype": profiled, "step_time": step_time.source}})
    plot(comparison, Path(f"{args.out}.png"))


def plot(comparison: dict[str, dict[str, Any]], path: Path) -> None:
    from benchmarks.plots import pyplot

    plt = pyplot()
    names = list(next(iter(comparison.values())))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(comparison)
    for offset, (system, rows) in enumerate(comparison.items()):
        ax.bar([i + offset * width for i in range(len(names))], [rows[n]["error"] * 100 for n in names],
               width, label=system)
    ax.axhline(10, color="grey", linestyle="--", linewidth=0.8)
    ax.axhline(-10, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xticks([i + width * (len(comparison) - 1) / 2 for i in range(len(names))], names, rotation=20)
    ax.set_ylabel("simulated - measured (%)")
    ax.set_title("Simulator against the measured throughput benchmark")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
