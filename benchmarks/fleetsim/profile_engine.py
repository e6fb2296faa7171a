"""Profile this machine's engine step by step and fit the simulator's step time.

    .venv/bin/python -m benchmarks.fleetsim.profile_engine      # ~4 min; writes benchmarks/results/step_profile.{json,png}

vLLM runs as a replica runs it: the engine core in its own process, this
process as its front end, moved off the engine's cores (`cpu_isolate_workers`),
with the engine settings of the config's first pool, the dtype it resolves to
here, and its KV cache size. A step is timed from the front end, from one
output message of the engine core to the next, so it includes what a served
step costs besides the model (scheduling, the core's I/O threads, messages);
its shape follows from the outputs. The sweep covers what serving makes:
prefills of one prompt and of many at once, decode batches of 1 to
`max_num_seqs` requests at short and long contexts, and decodes with prefills
mixed in; the sweeps run `--repeats` times, interleaved. `LinearStepTime` is
fitted to every step but each sweep's first, and the fit's error is reported
per sweep. Not here: the ingress and Serve's
proxy, which share the replica's machine; the validation against the live
benchmarks measures what they add (`benchmarks/fleetsim/validate.py`).
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import time
from dataclasses import astuple, fields
from pathlib import Path

import psutil

from benchmarks.fleetsim.engine import step_shape
from benchmarks.fleetsim.step_time import LinearStepTime, StepShape
from benchmarks.provenance import command_line, measured_on
from benchmarks.report import write_json
from serve_app.config.app import app_configs, load_serve_config

SWEEPS: dict[str, list[tuple[int, int, int, int]]] = {
    # name: groups of (requests, prompt tokens, output tokens, steps between arrivals; 0: all at once).
    # No step may prefill more than `max_num_batched_tokens` (2048 in the shipped configs): a chunk
    # that completes no prompt sends no output, and the front end would see two steps as one.
    "prefill": [(1, p, 1, 0) for p in (32, 128, 512, 1024, 2000)] + [(n, 64, 1, 0) for n in (4, 16, 32)],
    "decode short context": [(n, 32, 48, 0) for n in (1, 2, 4, 8, 16, 24, 32)],
    "decode long context": [(n, 768, 32, 1) for n in (4, 8, 16)],
    "decode with arrivals": [(24, 96, 40, 2), (32, 32, 64, 1)],
}


def run_sweep(engine, groups: list[tuple[int, int, int, int]], seed: int) -> list[tuple[StepShape, float]]:
    """Each engine step's shape and seconds, as the front end sees them: the engine core
    runs in its own process and sends each step's outputs as one message, which one
    `LLMEngine.step()` returns; a step lasts from the previous message (or from the
    requests' arrival at an idle engine) to its own. Its shape follows from its outputs:
    a request's first token ends its prefill, a later one is a decode over its context."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    rng = random.Random(seed)
    ids = itertools.count()
    prompts: dict[str, int] = {}
    produced: dict[str, int] = {}
    steps: list[tuple[StepShape, float]] = []
    for count, prompt, output, every in groups:
        params = SamplingParams(max_tokens=output, ignore_eos=True, temperature=0.0,
                                output_kind=RequestOutputKind.DELTA)  # as the app's replica streams
        arrivals = list(range(count))
        step_number = 0
        last = time.perf_counter()
        while arrivals or engine.has_unfinished_requests():
            while arrivals and (every == 0 or step_number % every == 0):
                arrivals.pop()
                request_id = f"{seed}-{next(ids)}"
                prompts[request_id], produced[request_id] = prompt, 0
                engine.add_request(request_id, {"prompt_token_ids": [rng.randrange(100, 20000) for _ in range(prompt)]},
                                   params)
                if every:
                    break
            if step_number == 0 or not any(produced.values()):
                last = time.perf_counter()  # an idle engine's step starts with its requests
            outputs = engine.step()
            now = time.perf_counter()
            ran = []  # per request: (tokens computed before the step, new tokens, decoding)
            for out in outputs:
                before = produced[out.request_id]
                prompt = prompts[out.request_id]
                ran.append((prompt + before - 1, 1, True) if before else (0, prompt, False))
                produced[out.request_id] += len(out.outputs[0].token_ids)
                if out.finished:
                    del prompts[out.request_id], produced[out.request_id]
            if outputs:
                steps.append((step_shape(ran), now - last))
            last = now
            step_number += 1
    return steps[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/local.yaml")
    parser.add_argument("--out", default="benchmarks/results/step_profile")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    (config,) = app_configs(load_serve_config(args.config)).values()
    model = config.models[0]
    engine_config = model.pool_engine(model.pools[0])
    if engine_config.cpu_kv_cache_gib is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(engine_config.cpu_kv_cache_gib)
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    from serve_app.engine.cpu_cores import keep_off, worker_cores
    from serve_app.engine.cpu_dtype import engine_kwargs_here

    kwargs = engine_kwargs_here(engine_config)
    engine = LLMEngine.from_engine_args(EngineArgs(**kwargs, disable_log_stats=True))
    if engine_config.cpu_isolate_workers:  # as a replica does: this process off the engine's cores
        keep_off(worker_cores(psutil.Process().children(recursive=True)), [psutil.Process()])
    measured: dict[str, list[tuple[StepShape, float]]] = {name: [] for name in SWEEPS}
    for repeat in range(args.repeats):  # interleaved: a slow spell of the machine spreads over every sweep
        for number, (name, groups) in enumerate(SWEEPS.items()):
            started = time.perf_counter()
            steps = run_sweep(engine, groups, seed=repeat * len(SWEEPS) + number)
            measured[name] += steps
            print(f"[profile] repeat {repeat + 1}/{args.repeats}, {name}: {len(steps)} steps in "
                  f"{time.perf_counter() - started:.0f}s", flush=True)
    every = [step for steps in measured.values() for step in steps]
    source = f"{args.out}.json: vLLM CPU {kwargs['dtype']} steps profiled on {measured_on()}"
    model_fit = LinearStepTime.fit([shape for shape, _ in every], [s for _, s in every], source)
    errors = {name: fit_error(model_fit, steps) for name, steps in measured.items()}
    for name, error in errors.items():
        print(f"[profile] {name}: median |error| {error['median_abs_pct']:.1f}%, p90 {error['p90_abs_pct']:.1f}%")
    print(f"[profile] fit: {model_fit}")
    result = {
        "benchmark": "step_profile", "config": args.config, "command": command_line(),
        "engine": {**engine_config.model_dump(), "dtype_resolved": kwargs["dtype"]},
        "model": {**vars(model_fit)}, "fit_error": errors,
        "steps": {name: [[*astuple(s), round(t * 1e6)] for s, t in steps] for name, steps in measured.items()},
        "steps_columns": [*(f.name for f in fields(StepShape)), "step_us"],
    }
    write_json(Path(f"{args.out}.json"), result, {"engine": {"dtype": kwargs["dtype"]}})
    plot(measured, model_fit, Path(f"{args.out}.png"))


def fit_error(model_fit: LinearStepTime, steps: list[tuple[StepShape, float]]) -> dict[str, float]:
    from serve_app.quantile import quantile

    errors = [abs(model_fit.step_s(shape) - seconds) / seconds * 100 for shape, seconds in steps]
    return {"steps": len(steps), "median_abs_pct": quantile(errors, 0.5), "p90_abs_pct": quantile(errors, 0.9)}


def plot(measured: dict[str, list[tuple[StepShape, float]]], model_fit: LinearStepTime, path: Path) -> None:
    from benchmarks.plots import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 5))
    for name, steps in measured.items():
        ax.scatter([t * 1e3 for _, t in steps], [model_fit.step_s(s) * 1e3 for s, _ in steps], s=8, label=name)
    top = max(t for steps in measured.values() for _, t in steps) * 1e3
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8)
    ax.set_xlabel("measured step (ms)")
    ax.set_ylabel("fitted step (ms)")
    ax.set_title("Engine step time: measured against the fitted model")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
