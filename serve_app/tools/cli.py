"""`serve-app` command line: validate configs, prepare and quantize the tiny model,
plan costs, generate the KubeRay manifests."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError


def validate(paths: list[str]) -> int:
    """Validate each Serve config file's application args; print what failed."""
    from serve_app.config import app_configs, load_serve_config

    failed = 0
    for path in paths:
        try:
            apps = app_configs(load_serve_config(path))
        except (ValidationError, ValueError, OSError) as exc:
            failed += 1
            print(f"{path}: INVALID\n{exc}", file=sys.stderr)
            continue
        for name, config in apps.items():
            models = ", ".join(
                f"{m.name} ({m.engine.quantization or 'unquantized'}; pools {'/'.join(p.name for p in m.pools)})"
                for m in config.models
            )
            print(f"{path}: app {name!r} ok: models {models}; {len(config.templates)} templates")
    return 1 if failed else 0


def build_once(dest: str, doing: str, build) -> int:
    """Run `build` unless `dest` is already a prepared checkpoint."""
    from serve_app.tools.model_prep import is_prepared

    if is_prepared(Path(dest)):
        print(f"[model] {dest} already prepared")
        return 0
    print(f"[model] {doing} at {dest}")
    build()
    print(f"[model] wrote {dest}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="serve-app", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("validate", help="validate Serve config files")
    check.add_argument("paths", nargs="+")
    prep = commands.add_parser("prepare-model", help="convert the shipped tiny model once")
    prep.add_argument("--dest", default="models/SmolLM2-135M-Instruct")
    quant = commands.add_parser("quantize-w8a8", help="write an INT8 (W8A8) copy of a prepared checkpoint")
    quant.add_argument("--src", default="models/SmolLM2-135M-Instruct")
    quant.add_argument("--dest", default="models/SmolLM2-135M-Instruct-W8A8")
    plan = commands.add_parser("plan", help="monthly cost per setup from a benchmark result and prices")
    plan.add_argument("args", nargs=argparse.REMAINDER, help="see `python -m serve_app.planner --help`")
    kuberay = commands.add_parser("kuberay", help="(re)generate kuberay/manifests from configs/prod.yaml")
    kuberay.add_argument("args", nargs=argparse.REMAINDER, help="see `serve-app kuberay --help`")
    args = parser.parse_args(argv)
    if args.command == "validate":
        return validate(args.paths)
    if args.command == "plan":
        from serve_app.tools import planner

        return planner.main(args.args)
    if args.command == "kuberay":
        from serve_app.tools.kuberay import render as kuberay_manifests

        return kuberay_manifests.main(args.args)
    from serve_app.tools.model_prep import prepare_smollm2, quantize_w8a8_int8

    if args.command == "quantize-w8a8":
        return build_once(
            args.dest, "writing a W8A8 INT8 copy of " + args.src,
            lambda: quantize_w8a8_int8(Path(args.src), Path(args.dest)),
        )
    return build_once(
        args.dest, "converting the SmolLM2-135M-Instruct GGUF to a HF checkpoint (~20 s)",
        lambda: prepare_smollm2(Path(args.dest)),
    )


if __name__ == "__main__":
    sys.exit(main())
