"""What the image must import: the Python check of `kuberay/Dockerfile`'s build
step, run here with this environment's Python (no image is built in the tests),
and every import path the Serve configs and the generated manifests name."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.serve.request_router import RequestRouter

from serve_app.config import app_configs, load_serve_config
from serve_app.topology import Topology
from tests.conftest import REPO
from tests.kuberay.schemas import load_documents

DOCKERFILE = REPO / "kuberay/Dockerfile"
IMPORT_PATH_KEYS = ("import_path", "policy_function", "request_router_class")
"""Serve config and deployment-option keys whose value Ray imports."""


def run_instruction(dockerfile: str) -> str:
    """The Dockerfile's one RUN instruction, continuation lines joined."""
    (run,) = re.findall(r"^RUN ((?:.*\\\n)*.*)$", dockerfile, re.M)
    return re.sub(r"\\\n\s*", " ", run)


def python_check(dockerfile: str) -> str:
    """The `python -c "..."` step of the RUN instruction, as the shell gets it."""
    (check,) = [step.strip() for step in run_instruction(dockerfile).split("&&")
                if step.strip().startswith("python -c ")]
    return check


def default_build_arg(dockerfile: str, name: str) -> str:
    (value,) = re.findall(rf"^ARG {name}=(\S+)$", dockerfile, re.M)
    return value


def import_paths(tree: Any) -> list[tuple[str, str]]:
    """(key, value) of every IMPORT_PATH_KEYS entry anywhere in a YAML tree."""
    if isinstance(tree, dict):
        found = [(key, value) for key, value in tree.items() if key in IMPORT_PATH_KEYS and isinstance(value, str)]
        return found + [entry for value in tree.values() for entry in import_paths(value)]
    if isinstance(tree, list):
        return [entry for value in tree for entry in import_paths(value)]
    return []


def serve_configs() -> dict[str, dict[str, Any]]:
    """Every Serve config: configs/*.yaml and the serveConfigV2 of each generated RayService."""
    configs = {path.relative_to(REPO).as_posix(): load_serve_config(path)
               for path in sorted((REPO / "configs").glob("*.yaml"))}
    for path in sorted((REPO / "kuberay/manifests").glob("*.yaml")):
        for document in load_documents(path):
            if document["kind"] == "RayService":
                name = f"{path.relative_to(REPO).as_posix()} serveConfigV2"
                configs[name] = yaml.safe_load(document["spec"]["serveConfigV2"])
    return configs


def named_import_paths() -> list[tuple[str, str, str]]:
    """(where, key, import path): the configs' own entries and the options the
    app's Topology gives each deployment (its request router)."""
    entries = []
    for where, config in serve_configs().items():
        entries += [(where, key, value) for key, value in import_paths(config)]
        for app in app_configs(config).values():
            for deployment in Topology(app).deployments:
                entries += [(f"{where} {deployment.name}", key, value)
                            for key, value in import_paths(deployment.options)]
    return sorted(set(entries))


NAMED = named_import_paths()


def resolve(path: str) -> Any:
    """What Ray imports for `module:attr` (or `module.attr`)."""
    module, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    found: Any = importlib.import_module(module)
    for part in attr.split("."):
        found = getattr(found, part)
    return found


def test_the_images_python_check_passes_here():
    """The check the image build runs after `pip install`, with BASE_TAG's default."""
    dockerfile = DOCKERFILE.read_text()
    env = {**os.environ, "BASE_TAG": default_build_arg(dockerfile, "BASE_TAG"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-c", python_check(dockerfile)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_every_config_names_import_paths_and_the_images_check_imports_them():
    assert {key for _, key, _ in NAMED} == set(IMPORT_PATH_KEYS)
    check = python_check(DOCKERFILE.read_text())
    for _, _, path in NAMED:
        module = path.partition(":")[0] if ":" in path else path.rpartition(".")[0]
        assert re.search(rf"\b{re.escape(module)}\b", check), f"the image's check does not import {module}"


@pytest.mark.parametrize(("where", "key", "path"), NAMED, ids=[f"{w} {k}" for w, k, _ in NAMED])
def test_import_path_resolves(where, key, path):
    found = resolve(path)
    if key == "request_router_class":
        assert isinstance(found, type) and issubclass(found, RequestRouter), where
    else:
        assert callable(found), where  # an app builder or an autoscaling policy
