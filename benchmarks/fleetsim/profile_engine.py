"""Profile this machine's engine step by step and fit the simulator's step time.

    .venv/bin/python -m benchmarks.fleetsim.profile_engine      # ~5 min; writes benchmarks/results/step_profile.{json,png}

vLLM runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) with the engine
settings of the config's first pool, the dtype it resolves to here, and its
KV cache size. Each engine core step (schedule, model, sampling, update) is
timed (`step_fn`: not the output processing, which a server does in its front
end), and its shape is read from the scheduler's own output: for every
scheduled request, its new tokens and the tokens it had computed before. The
sweep covers what serving makes: prefills of one prompt and of many at once,
decode batches of 1 to `max_num_seqs` requests at short and long contexts,
and decodes with prefills mixed in. `LinearStepTime` is fitted to every step
but each sweep's first (its warmup), and the fit's error is reported per
sweep. The engine runs alone here: a live replica shares the machine with the
ingress and Serve's proxy, which the validation against the live benchmarks
measures (`benchmarks/fleetsim/validate.py`).
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import time
from pathlib import Path

from benchmarks.fleetsim.step_time import LinearStepTime, StepShape
from benchmarks.provenance import command_line, measured_on
from benchmarks.report import write_json
from serve_app.config.app import app_configs, load_serve_config

SWEEPS: dict[str, list[tuple[int, int, int, int]]] = {
    # name: (requests, prompt tokens, output tokens, steps between arrivals) groups
    "prefill": [(1, p, 1, 0) for p in (32, 128, 512, 1024, 2000)] + [(n, 64, 1, 0) for n in (4, 16, 32)],
    "decode short context": [(n, 32, 48, 0) for n in (1, 2, 4, 8, 16, 24, 32)],
    "decode long context": [(n, 768, 32, 0) for n in (1, 8, 16, 32)],
    "decode with arrivals": [(24, 96, 40, 2), (32, 32, 64, 1)],
}


def shape_of(core, scheduler_output) -> StepShape:
    """The step's shape from the scheduler's output (computed tokens are read after
    `schedule()` advanced them, so each request's count before the step is less its new tokens)."""
    decode = prefill = context = 0
    for request_id, new in scheduler_output.num_scheduled_tokens.items():
        request = core.scheduler.requests[request_id]
        before = request.num_computed_tokens - new
        context += before
        if new == 1 and before >= request.num_prompt_tokens:
            decode += 1
        else:
            prefill += new
    return StepShape(decode, prefill, context)


def run_sweep(engine, core, groups: list[tuple[int, int, int, int]], seed: int) -> list[tuple[StepShape, float]]:
    """Each step's shape and seconds in `EngineCore.step_fn` (schedule, model,
    sampling, update; not the output processing a server does in its front end)."""
    from vllm import SamplingParams

    rng = random.Random(seed)
    ids = itertools.count()
    steps: list[tuple[StepShape, float]] = []
    schedule, step_fn = core.scheduler.schedule, core.step_fn
    shapes: list[StepShape] = []

    def shaped_schedule(*args, **kwargs):
        output = schedule(*args, **kwargs)
        if output.total_num_scheduled_tokens:
            shapes.append(shape_of(core, output))  # now: a request that ends this step leaves the scheduler
        return output

    def timed_step():
        shapes.clear()
        started = time.perf_counter()
        result = step_fn()
        if shapes:
            steps.append((shapes[-1], time.perf_counter() - started))
        return result

    core.scheduler.schedule, core.step_fn = shaped_schedule, timed_step
    try:
        for count, prompt, output, every in groups:
            params = SamplingParams(max_tokens=output, ignore_eos=True, temperature=0.0)
            arrivals = list(range(count))
            step_number = 0
            while arrivals or engine.has_unfinished_requests():
                while arrivals and (every == 0 or step_number % every == 0):
                    tokens = [rng.randrange(100, 20000) for _ in range(prompt)]
                    arrivals.pop()
                    engine.add_request(f"{seed}-{next(ids)}", {"prompt_token_ids": tokens}, params)
                    if every:
                        break
                engine.step()
                step_number += 1
    finally:
        core.scheduler.schedule, core.step_fn = schedule, step_fn
    return steps[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/local.yaml")
    parser.add_argument("--out", default="benchmarks/results/step_profile")
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    (config,) = app_configs(load_serve_config(args.config)).values()
    model = config.models[0]
    engine_config = model.pool_engine(model.pools[0])
    if engine_config.cpu_kv_cache_gib is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(engine_config.cpu_kv_cache_gib)
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    from serve_app.engine.cpu_dtype import engine_kwargs_here

    kwargs = engine_kwargs_here(engine_config)
    engine = LLMEngine.from_engine_args(EngineArgs(**kwargs, disable_log_stats=True))
    core = engine.engine_core.engine_core
    measured: dict[str, list[tuple[StepShape, float]]] = {}
    for number, (name, groups) in enumerate(SWEEPS.items()):
        started = time.perf_counter()
        measured[name] = run_sweep(engine, core, groups, seed=number)
        print(f"[profile] {name}: {len(measured[name])} steps in {time.perf_counter() - started:.0f}s", flush=True)
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
        "steps": {name: [[s.decode_seqs, s.prefill_tokens, s.context_tokens, round(t * 1e6)] for s, t in steps]
                  for name, steps in measured.items()},
        "steps_columns": ["decode_seqs", "prefill_tokens", "context_tokens", "step_us"],
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
