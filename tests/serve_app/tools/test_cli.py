"""Every `serve-app` subcommand runs as the README and scripts/setup_env.sh show it,
as a subprocess: `--help` lists its own options, and validate, plan, kuberay
--check, prices refresh (without credentials) and the model steps (already done)
really run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import pytest

from serve_app.tools.model_prep import DONE_MARKER
from tests.conftest import REPO
from tests.serve_app.cost.test_measured import factor, throughput, write

OPTIONS = {
    "validate": ["CONFIG"],
    "prepare-model": ["--dest"],
    "quantize-w8a8": ["--src", "--dest"],
    "plan": ["--baseline", "--measured", "--requests-per-month", "--peak-rps", "--prices", "--instance-type",
             "--spot-share", "--out"],
    "prices refresh": ["--file", "--region", "--instance-type"],
    "kuberay": ["--spec", "--check"],
}
NO_AWS = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
          "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE",
          "AWS_ROLE_ARN"}


def serve_app(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serve_app.tools.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=env)


def test_the_console_script_is_this_main():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["serve-app"] == "serve_app.tools.cli:main"


@pytest.mark.parametrize("command", list(OPTIONS))
def test_each_subcommand_shows_its_own_options(command):
    done = serve_app(*command.split(), "--help")
    assert done.returncode == 0, done.stderr
    for option in OPTIONS[command]:
        assert option in done.stdout, (command, option)


def test_the_planner_module_runs_on_its_own():
    done = subprocess.run([sys.executable, "-m", "serve_app.tools.planner", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "--baseline" in done.stdout


def test_validate_checks_the_shipped_configs():
    done = serve_app("validate", "configs/local.yaml", "configs/prod.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(": app 'llm' ok") == 2


def test_validate_fails_on_an_unknown_instance_type(tmp_path):
    text = (REPO / "configs" / "local.yaml").read_text().replace("instance_type: m7i.2xlarge", "instance_type: x9.huge")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    done = serve_app("validate", str(bad))
    assert done.returncode == 1 and "unknown instance type 'x9.huge'" in done.stderr


def test_plan_runs_with_its_options(tmp_path):
    mixed = write(tmp_path / "mixed.json", {"factors": {"length_scheduling": factor(1.1, "length_scheduling")}})
    out = tmp_path / "plan"
    done = serve_app("plan", "--baseline", str(throughput(tmp_path)), "--measured", str(mixed),
                     "--requests-per-month", "30e6", "--mean-output-tokens", "200", "--instance-type", "m7i.2xlarge",
                     "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "all combined" in done.stdout and "NOT MEASURED" in done.stdout
    assert json.loads(out.with_suffix(".json").read_text())["factors"]["length_scheduling"]["source"] == str(mixed)
    assert out.with_suffix(".png").exists()


def test_kuberay_check_reads_the_written_manifests():
    done = serve_app("kuberay", "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "manifests up to date" in done.stdout


def test_prices_refresh_without_credentials_says_so_and_leaves_the_file(tmp_path):
    book = tmp_path / "prices.yaml"
    book.write_text((REPO / "serve_app" / "cost" / "prices.yaml").read_text())
    before = book.read_bytes()
    env = {key: value for key, value in os.environ.items() if key not in NO_AWS}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    done = serve_app("prices", "refresh", "--file", str(book), env=env)
    assert done.returncode == 2
    assert "no AWS credentials" in done.stderr and "not touched" in done.stderr
    assert book.read_bytes() == before


def test_model_steps_take_the_options_setup_env_passes(tmp_path):
    src, dest = tmp_path / "model", tmp_path / "model-W8A8"
    for folder in (src, dest):
        folder.mkdir()
        (folder / DONE_MARKER).write_text("{}")
    done = serve_app("prepare-model", "--dest", str(src))
    assert done.returncode == 0 and "already prepared" in done.stdout, done.stderr
    done = serve_app("quantize-w8a8", "--src", str(src), "--dest", str(dest))
    assert done.returncode == 0 and "already prepared" in done.stdout, done.stderr
