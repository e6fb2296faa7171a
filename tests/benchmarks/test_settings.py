"""The settings table says what each system was given: every recorded setting is
checked against the command, environment and config each server is started with."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from benchmarks.ray_serve_llm_app import llm_config_kwargs
from benchmarks.servers import ServeRunServer, VLLMServer
from benchmarks.settings import differing, settings_table
from benchmarks.systems import first_app, registry

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def systems():
    return registry(REPO, "configs/local.yaml", "configs/local-nobuckets.yaml", "configs/local-int8.yaml")


def flag_value(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def check_vllm(server: VLLMServer, settings: dict) -> None:
    command = server.command()
    assert flag_value(command, "--stream-interval") == (None if settings["stream_interval"] == "1"
                                                        else settings["stream_interval"])
    assert ("--disable-log-stats" in command) == (settings["stats_logging"] == "off")
    assert flag_value(command, "--dtype") == settings["dtype"]
    assert flag_value(command, "--model") == settings["model"]
    for key, value in settings.items():
        if key.startswith("engine."):
            flag = "--" + key.removeprefix("engine.").replace("_", "-")
            if isinstance(value, bool):
                assert (flag if value else "--no-" + flag[2:]) in command, key
            else:
                assert flag_value(command, flag) == str(value), key
        if key.startswith("env."):
            assert server.env()[key.removeprefix("env.")] == str(value), key
    assert settings["cpu_isolation"].startswith("none") and settings["length_awareness"] == "off"


def check_app(server: ServeRunServer, settings: dict) -> None:
    model = first_app(server.config_path).models[0]
    assert settings["stream_interval"].split()[0] == str(model.stream_chunk_tokens)
    assert settings["cpu_isolation"].startswith("other processes moved off") == model.engine.cpu_isolate_workers
    assert settings["length_awareness"] == ("on" if model.length_scheduling.enabled else "off")
    assert settings["model"] == model.engine.model and settings["stats_logging"] == "off"
    configured = {k: v for k, v in model.engine.engine_kwargs().items() if k not in ("model", "dtype")}
    assert {k.removeprefix("engine."): v for k, v in settings.items() if k.startswith("engine.")} == configured
    actor_env = (model.deployment.serve_options().get("ray_actor_options") or {}).get("runtime_env") or {}
    given = {**(actor_env.get("env_vars") or {}), "VLLM_CPU_KVCACHE_SPACE": model.engine.cpu_kv_cache_gib,
             **{k: v for k, v in server.env().items() if k.startswith("RAY_worker")}}
    for key, value in settings.items():
        if key.startswith("env."):
            assert str(given.get(key.removeprefix("env."))) == str(value), key


def test_each_systems_recorded_settings_are_what_it_is_started_with(systems):
    for name, system in systems.items():
        if name == "rayllm":
            continue
        server = system.make()
        try:
            (check_vllm if isinstance(server, VLLMServer) else check_app)(server, system.settings)
        finally:
            shutil.rmtree(server.log_path.parent, ignore_errors=True)


def test_ray_serve_llm_settings_are_its_llm_config(systems):
    settings = systems["rayllm"].settings
    kwargs = llm_config_kwargs(first_app(REPO / "configs/local.yaml").models[0], REPO)
    engine = {k: v for k, v in kwargs["engine_kwargs"].items() if k != "dtype"}
    assert {k.removeprefix("engine."): v for k, v in settings.items() if k.startswith("engine.")} == engine
    assert kwargs["engine_kwargs"]["dtype"] == settings["dtype"]
    assert "disable_log_stats" not in engine and settings["stats_logging"] == "on"  # vLLM's default: on
    assert "stream_interval" not in engine and settings["stream_interval"] == "1"
    env = kwargs["runtime_env"]["env_vars"]
    assert {k.removeprefix("env."): v for k, v in settings.items() if k.startswith("env.")} == env


def test_the_headline_baseline_streams_as_the_app_does_and_the_default_is_shown_too(systems):
    app = first_app(REPO / "configs/local.yaml").models[0]
    assert systems["vllm"].settings["stream_interval"] == str(app.stream_chunk_tokens)
    assert systems["vllm-si1"].settings["stream_interval"] == "1"
    assert "--stream-interval" not in systems["vllm-si1"].make().command()


def test_the_table_has_a_row_for_each_differing_setting_with_each_systems_value(systems):
    settings = {name: s.settings for name, s in systems.items()}
    table = settings_table(settings).splitlines()
    rows = differing(settings)
    assert {"stream_interval", "cpu_isolation", "stats_logging", "length_awareness"} <= set(rows)
    assert "dtype" not in rows and "server" in rows  # one machine: one dtype for all
    assert table[0] == "| setting | " + " | ".join(f"`{n}`" for n in settings) + " |"
    for line in table[2:]:
        key, *cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells == ["-" if settings[n].get(key) is None else str(settings[n][key]) for n in settings], key
    assert len(table) == 2 + len(rows)
    same = {"a": {"x": 1}, "b": {"x": 1}}
    assert differing(same) == {} and settings_table(same) == "All systems ran with the same settings."
    assert differing({"a": {"x": 1}, "b": {"x": 1, "y": 2}}) == {"y": {"a": None, "b": 2}}


def test_the_app_config_the_table_reads_is_the_one_served(systems):
    server = systems["app"].make()
    try:
        served = yaml.safe_load(server.config_path.read_text())
        assert served["applications"] == yaml.safe_load((REPO / "configs/local.yaml").read_text())["applications"]
    finally:
        shutil.rmtree(server.log_path.parent, ignore_errors=True)
