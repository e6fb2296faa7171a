"""`serve-app` command line: validate configs, prepare and quantize the tiny model,
plan costs, refresh prices, generate the KubeRay manifests. Each subcommand
takes its own options (`serve-app SUBCOMMAND --help`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

from serve_app.tools import planner, prices_refresh


def validate(paths: list[str]) -> int:
    """Validate each Serve config file's application args, prices included; print what failed."""
    from serve_app.config import app_configs, load_serve_config
    from serve_app.cost.prices import Prices

    failed = 0
    for path in paths:
        try:
            apps = app_configs(load_serve_config(path))
            for config in apps.values():
                if config.cost is not None:
                    Prices.resolve(config.cost)
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


def kuberay(spec: str | None, check: bool) -> int:
    """`serve_app.tools.kuberay.render.main` with the options given (its own defaults otherwise)."""
    from serve_app.tools.kuberay import render

    return render.main((["--spec", spec] if spec else []) + (["--check"] if check else []))


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="serve-app", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)
    check = commands.add_parser("validate", help="validate Serve config files offline")
    check.add_argument("paths", nargs="+", metavar="CONFIG", help="Serve config file (e.g. configs/prod.yaml)")
    prep = commands.add_parser("prepare-model", help="convert the shipped tiny model once")
    prep.add_argument("--dest", default="models/SmolLM2-135M-Instruct", help="checkpoint folder (default: %(default)s)")
    quant = commands.add_parser("quantize-w8a8", help="write an INT8 (W8A8) copy of a prepared checkpoint")
    quant.add_argument("--src", default="models/SmolLM2-135M-Instruct", help="prepared checkpoint (default: %(default)s)")
    quant.add_argument("--dest", default="models/SmolLM2-135M-Instruct-W8A8", help="output folder (default: %(default)s)")
    plan = commands.add_parser("plan", help="monthly cost of five setups from measured throughput and prices",
                               description=planner.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    planner.add_arguments(plan)
    prices = commands.add_parser("prices", help="the price book").add_subparsers(dest="prices_command", required=True)
    refresh = prices.add_parser("refresh", help="rewrite instance prices from the AWS APIs",
                                description=prices_refresh.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    prices_refresh.add_arguments(refresh)
    manifests = commands.add_parser("kuberay", help="(re)generate kuberay/manifests from the cluster spec")
    manifests.add_argument("--spec", help="cluster spec (default: kuberay/cluster.yaml)")
    manifests.add_argument("--check", action="store_true", help="fail if the written manifests are out of date")
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "validate":
        return validate(args.paths)
    if args.command == "plan":
        return planner.run(args)
    if args.command == "prices":
        return prices_refresh.run(args)
    if args.command == "kuberay":
        return kuberay(args.spec, args.check)
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
