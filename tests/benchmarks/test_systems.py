"""Each benchmark system starts the server its name promises."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from benchmarks.systems import registry, server_command

REPO = Path(__file__).resolve().parents[2]


def test_each_app_system_serves_its_own_config() -> None:
    systems = registry(REPO, "configs/local.yaml", "configs/local-nobuckets.yaml", "configs/local-int8.yaml")
    expected = {"app": "local.yaml", "nobuckets": "local-nobuckets.yaml", "int8": "local-int8.yaml"}
    for name, config_file in expected.items():
        server = systems[name].make()
        try:
            served = yaml.safe_load(server.config_path.read_text())
            original = yaml.safe_load((REPO / "configs" / config_file).read_text())
            assert server.config_path.name == config_file, name
            assert served["applications"] == original["applications"], name
        finally:
            shutil.rmtree(server.config_path.parent, ignore_errors=True)


def test_a_recorded_server_command_names_no_path_of_this_machine() -> None:
    server = registry(REPO, "configs/local.yaml", "configs/local-nobuckets.yaml", "configs/local-int8.yaml")["app"].make()
    try:
        command = server_command(server)
    finally:
        shutil.rmtree(server.config_path.parent, ignore_errors=True)
    assert str(REPO) not in command and "/tmp/" not in command, command
    assert command.startswith(".venv/bin/serve run") and command.endswith("<tmp>/local.yaml"), command
