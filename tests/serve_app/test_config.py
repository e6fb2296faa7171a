import pytest
from pydantic import ValidationError
from ray.serve.schema import ServeDeploySchema

from serve_app.builder import build_from_config, deployment_name
from serve_app.config import AppConfig, DeploymentOptions, app_configs, load_serve_config
from tests.conftest import REPO

CONFIG_FILES = ["configs/local.yaml", "configs/local-int8.yaml", "configs/prod.yaml"]


def minimal(**model_overrides):
    model = {"name": "m", "engine": {"model": "some/dir"}, **model_overrides}
    return {"models": [model]}


@pytest.mark.parametrize("path", CONFIG_FILES)
def test_shipped_configs_validate_as_serve_and_app_configs(path):
    raw = load_serve_config(REPO / path)
    schema = ServeDeploySchema.model_validate(raw)
    assert [app.import_path for app in schema.applications] == ["serve_app.builder:build_app"]
    apps = app_configs(raw)
    assert apps["llm"].models


@pytest.mark.parametrize("path", CONFIG_FILES)
def test_shipped_configs_build_without_a_cluster(path):
    config = app_configs(load_serve_config(REPO / path))["llm"]
    app = build_from_config(config)
    assert app is not None


def test_local_config_runs_the_tiny_model_quantized_on_cpu():
    config = app_configs(load_serve_config(REPO / "configs/local.yaml"))["llm"]
    engines = [model.engine for model in config.models]
    assert any(engine.quantization == "int8_per_channel_weight_only" for engine in engines)
    assert all(engine.model.endswith("SmolLM2-135M-Instruct") for engine in engines)
    assert all(not model.deployment.ray_actor_options.get("num_gpus") for model in config.models)


def test_prod_config_is_fp8_on_gpus_with_tensor_parallel_where_needed():
    config = app_configs(load_serve_config(REPO / "configs/prod.yaml"))["llm"]
    for model in config.models:
        assert model.engine.quantization == "fp8"
        gpus = model.deployment.ray_actor_options.get("num_gpus", 0) + sum(
            bundle.get("GPU", 0) for bundle in model.deployment.placement_group_bundles or []
        )
        assert gpus == model.engine.tensor_parallel_size
    assert max(model.engine.tensor_parallel_size for model in config.models) > 1


def test_unknown_field_is_named_with_its_path():
    args = minimal()
    args["models"][0]["engine"]["max_num_seq"] = 8
    with pytest.raises(ValidationError) as info:
        AppConfig.model_validate(args)
    assert "models.0.engine.max_num_seq" in str(info.value)


def test_wrong_type_is_named_with_its_path():
    args = minimal()
    args["models"][0]["engine"]["max_model_len"] = "long"
    with pytest.raises(ValidationError) as info:
        AppConfig.model_validate(args)
    assert "models.0.engine.max_model_len" in str(info.value)


def test_duplicate_model_names_are_refused():
    args = {"models": minimal()["models"] * 2}
    with pytest.raises(ValidationError, match="duplicate model names: m"):
        AppConfig.model_validate(args)


def test_no_models_is_refused():
    with pytest.raises(ValidationError, match="models"):
        AppConfig.model_validate({"models": []})


def test_replicas_and_autoscaling_are_exclusive():
    with pytest.raises(ValidationError, match="either num_replicas or autoscaling_config"):
        DeploymentOptions(num_replicas=2, autoscaling_config={"min_replicas": 1})


def test_deployment_defaults_to_one_replica():
    assert DeploymentOptions().serve_options()["num_replicas"] == 1
    scaled = DeploymentOptions(autoscaling_config={"min_replicas": 0}).serve_options()
    assert "num_replicas" not in scaled


def test_bad_template_placeholder_fails_at_load():
    args = {**minimal(), "templates": {"t": {"prompt": "hi {user.__class__}"}}}
    with pytest.raises(ValidationError, match="template 't'"):
        AppConfig.model_validate(args)


def test_engine_kwargs_drop_unset_and_merge_extras():
    config = AppConfig.model_validate(minimal())
    engine = config.models[0].engine.model_copy(update={"extra_engine_args": {"enforce_eager": True}})
    kwargs = engine.engine_kwargs()
    assert kwargs["model"] == "some/dir" and kwargs["enforce_eager"] is True
    assert "max_model_len" not in kwargs and "cpu_kv_cache_gib" not in kwargs


def test_deployment_names_are_serve_safe():
    assert deployment_name("org/model:v1.5") == "LLMServer-org-model-v1-5"


def test_empty_serve_config_is_refused():
    with pytest.raises(ValueError, match="no applications"):
        app_configs({"applications": []})
