"""Record this model's own reply lengths on ShareGPT prompts, for the predictor benchmark.

Runs vLLM offline (CPU, float32 or native bf16) on the first human turns of the
predictor benchmark's seeded ShareGPT sample (prompts up to `--max-prompt-tokens`)
and writes, per request, its index in that sample, output tokens and finish
reason: a small JSON that `predictor_bench.py --lengths` replays. Start it under
the machine's engine lock:

    flock /tmp/engine.lock .venv/bin/python benchmarks/own_outputs.py --requests 400
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import sharegpt  # noqa: E402
from benchmarks.predictor_io import provenance, write_result  # noqa: E402
from serve_app.engine.cpu_dtype import cpu_flags, resolve_cpu_dtype  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--sample", type=int, default=10000, help="the predictor benchmark's sample size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--model", type=Path, default=REPO / "models" / "SmolLM2-135M-Instruct")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "smollm2_sharegpt_lengths.json")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    chosen, _ = sharegpt.load(args.sample, args.seed)
    dtype = resolve_cpu_dtype("auto", cpu_flags()).dtype
    llm = LLM(model=str(args.model), dtype=dtype, enforce_eager=True, max_model_len=args.max_prompt_tokens
              + args.max_tokens, seed=args.seed)
    tokenizer = llm.get_tokenizer()
    picked = []
    for index, conversation in enumerate(chosen):
        messages = [{"role": role, "content": content} for role, content in conversation.messages]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= args.max_prompt_tokens:
            picked.append((index, messages))
        if len(picked) == args.requests:
            break
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)  # engine seeded (a
    # per-request seed fails on vLLM CPU: "CPU Generator does not use offset")
    started = time.monotonic()
    outputs = llm.chat([m for _, m in picked], params, use_tqdm=True)
    elapsed = time.monotonic() - started
    rows = [[index, len(out.outputs[0].token_ids), out.outputs[0].finish_reason]
            for (index, _), out in zip(picked, outputs, strict=True)]
    write_result(args.out, {"provenance": provenance("benchmarks/own_outputs.py", sys.argv[1:]), "model": args.model.name, "dtype": dtype,
                            "sampling": {"max_tokens": args.max_tokens, "temperature": args.temperature,
                                         "seed": args.seed},
                            "sample": {"size": args.sample, "seed": args.seed, "max_prompt_tokens": args.max_prompt_tokens},
                            "generate_s": elapsed, "columns": ["sample_index", "output_tokens", "finish_reason"],
                            "rows": rows})
    print(f"{len(rows)} replies in {elapsed:.0f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
