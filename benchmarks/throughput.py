"""Throughput and latency: this app (`serve run`) vs `vllm serve`, same model and
engine settings, same machine, one invocation. Targets run one after another so
they never share the CPUs.

    python benchmarks/throughput.py --config configs/local.yaml \
        --requests 96 --concurrency 32 --max-tokens 128

Writes a JSON result and a PNG plot (default: results/throughput.{json,png}).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import openai

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import TOPICS, percentile, ratios  # noqa: E402
from benchmarks.servers import LocalServer, ServeRunServer, VLLMServer  # noqa: E402
from serve_app.config import app_configs, load_serve_config  # noqa: E402

RATIO_KEYS = ["output_tok_per_s", "latency_p50_s", "latency_p99_s", "ttft_p50_s", "ttft_p99_s"]


@dataclass
class RequestSample:
    latency_s: float
    ttft_s: float
    completion_tokens: int


@dataclass
class TargetResult:
    target: str
    startup_s: float
    wall_s: float
    requests: int
    failed: int
    output_tokens: int
    output_tok_per_s: float
    req_per_s: float
    latency_p50_s: float
    latency_p99_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    latencies_s: list[float] = field(repr=False)


async def one_request(client: openai.AsyncOpenAI, model: str, index: int, max_tokens: int) -> RequestSample:
    started = time.perf_counter()
    first_token_at = None
    tokens = 0
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"Write a short story about {TOPICS[index % len(TOPICS)]}."}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        if first_token_at is None and chunk.choices and chunk.choices[0].delta.content:
            first_token_at = time.perf_counter()
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    finished = time.perf_counter()
    return RequestSample(finished - started, (first_token_at or finished) - started, tokens)


async def run_load(server: LocalServer, requests: int, concurrency: int, max_tokens: int) -> tuple[float, list]:
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)
    await asyncio.gather(*(one_request(client, server.model_name, i, 16) for i in range(4)))  # warm-up
    gate = asyncio.Semaphore(concurrency)
    done = 0

    async def guarded(index: int):
        nonlocal done
        async with gate:
            try:
                return await one_request(client, server.model_name, index, max_tokens)
            except openai.OpenAIError as exc:
                return exc
            finally:
                done += 1
                if done % max(1, requests // 10) == 0 or done == requests:
                    print(f"  [{server.label}] {done}/{requests} requests", flush=True)

    started = time.perf_counter()
    results = await asyncio.gather(*(guarded(i) for i in range(requests)))
    return time.perf_counter() - started, results


def measure(server: LocalServer, args: argparse.Namespace) -> TargetResult:
    print(f"[{server.label}] starting (log: {server.log_path})", flush=True)
    startup = server.start()
    print(f"[{server.label}] answering after {startup:.0f}s; sending {args.requests} requests, "
          f"{args.concurrency} at a time, {args.max_tokens} tokens each", flush=True)
    try:
        wall, results = asyncio.run(run_load(server, args.requests, args.concurrency, args.max_tokens))
    finally:
        server.stop()
    samples = [r for r in results if isinstance(r, RequestSample)]
    tokens = sum(s.completion_tokens for s in samples)
    latencies = [s.latency_s for s in samples]
    ttfts = [s.ttft_s for s in samples]
    return TargetResult(
        target=server.label,
        startup_s=round(startup, 1),
        wall_s=round(wall, 2),
        requests=len(results),
        failed=len(results) - len(samples),
        output_tokens=tokens,
        output_tok_per_s=round(tokens / wall, 1),
        req_per_s=round(len(samples) / wall, 2),
        latency_p50_s=round(percentile(latencies, 50), 3),
        latency_p99_s=round(percentile(latencies, 99), 3),
        ttft_p50_s=round(percentile(ttfts, 50), 3),
        ttft_p99_s=round(percentile(ttfts, 99), 3),
        latencies_s=[round(x, 3) for x in latencies],
    )


def plot(results: list[TargetResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.target for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    axes[0].bar(names, [r.output_tok_per_s for r in results], color=["tab:blue", "tab:gray"][: len(names)])
    axes[0].set_title("output tokens/s (higher is better)")
    width = 0.35
    xs = range(len(names))
    for ax, metric, label in ((axes[1], "latency", "request latency (s)"), (axes[2], "ttft", "time to first token (s)")):
        ax.bar([x - width / 2 for x in xs], [getattr(r, f"{metric}_p50_s") for r in results], width, label="p50")
        ax.bar([x + width / 2 for x in xs], [getattr(r, f"{metric}_p99_s") for r in results], width, label="p99")
        ax.set_xticks(list(xs), names)
        ax.set_title(label + " (lower is better)")
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/local.yaml")
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--targets", default="app,vllm", help="comma list of: app, vllm")
    parser.add_argument("--out", default="results/throughput")
    args = parser.parse_args()

    config_path = REPO / args.config
    model = next(iter(app_configs(load_serve_config(config_path)).values())).models[0]
    servers = {"app": lambda: ServeRunServer(config_path, cwd=REPO), "vllm": lambda: VLLMServer(model, cwd=REPO)}
    results = [measure(servers[name](), args) for name in args.targets.split(",")]

    summary = {
        "benchmark": "throughput",
        "config": args.config,
        "model": model.name,
        "engine": model.engine.model_dump(),
        "workload": {"requests": args.requests, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
                     "ignore_eos": True, "temperature": 0, "endpoint": "/v1/chat/completions (stream)"},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "results": [asdict(r) for r in results],
    }
    if len(results) == 2:
        summary["ratio_app_vs_vllm"] = ratios(asdict(results[0]), asdict(results[1]), RATIO_KEYS)
    out = REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(summary, indent=2))
    plot(results, out.with_suffix(".png"), f"{model.name}: {args.requests} req x {args.max_tokens} tok, "
         f"{args.concurrency} concurrent")

    print(f"\n{'target':<12}{'tok/s':>9}{'req/s':>8}{'p50 s':>8}{'p99 s':>8}{'ttft50':>8}{'ttft99':>8}{'failed':>8}")
    for r in results:
        print(f"{r.target:<12}{r.output_tok_per_s:>9}{r.req_per_s:>8}{r.latency_p50_s:>8}{r.latency_p99_s:>8}"
              f"{r.ttft_p50_s:>8}{r.ttft_p99_s:>8}{r.failed:>8}")
    if "ratio_app_vs_vllm" in summary:
        print("ratio app/vllm:", summary["ratio_app_vs_vllm"])
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0 if all(r.failed == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
