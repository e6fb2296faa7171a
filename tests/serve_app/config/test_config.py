import pytest
from pydantic import ValidationError
from ray.serve.schema import ServeDeploySchema

from serve_app.app import build_from_config
from serve_app.config import AppConfig, DeploymentOptions, app_configs, load_serve_config
from tests.conftest import REPO

CONFIG_FILES = ["configs/local.yaml", "configs/local-int8.yaml", "configs/local-offpeak.yaml", "configs/local-nobuckets.yaml", "configs/prod.yaml"]


def minimal(**model_overrides):
    model = {"name": "m", "engine": {"model": "some/dir"}, **model_overrides}
    return {"models": [model]}


@pytest.mark.parametrize("path", CONFIG_FILES)
def test_shipped_configs_validate_as_serve_and_app_configs(path):
    raw = load_serve_config(REPO / path)
    schema = ServeDeploySchema.model_validate(raw)
    assert [app.import_path for app in schema.applications] == ["serve_app.app:build_app"]
    apps = app_configs(raw)
    assert apps["llm"].models


@pytest.mark.parametrize("path", CONFIG_FILES)
def test_shipped_configs_build_without_a_cluster(path):
    config = app_configs(load_serve_config(REPO / path))["llm"]
    app = build_from_config(config)
    assert app is not None


def test_local_configs_run_the_tiny_model_on_cpu_in_the_dtype_the_cpu_supports():
    config = app_configs(load_serve_config(REPO / "configs/local.yaml"))["llm"]
    engines = [model.engine for model in config.models]
    assert all(engine.dtype == "auto" and engine.quantization is None for engine in engines)
    assert all(engine.model.endswith("SmolLM2-135M-Instruct") for engine in engines)
    assert all(not model.deployment.serve_options()["ray_actor_options"].get("num_gpus") for model in config.models)
    int8 = app_configs(load_serve_config(REPO / "configs/local-int8.yaml"))["llm"].models[0].engine
    assert int8.quantization == "compressed-tensors" and int8.model.endswith("-W8A8")


def test_the_int8_config_is_the_local_one_but_for_its_quantized_checkpoint():
    """A benchmark of the two measures quantization and nothing else."""
    def normalized(path: str) -> dict:
        config = app_configs(load_serve_config(REPO / path))["llm"].model_dump()
        (model,) = config["models"]
        (shape,) = config["cost"]["replicas"].values()
        config["cost"]["replicas"] = {"model": shape}
        model["engine"].update(model="checkpoint", quantization="-")
        return {**config, "models": [{**model, "name": "model"}]}

    assert normalized("configs/local-int8.yaml") == normalized("configs/local.yaml")


def test_prod_config_is_fp8_on_gpus_with_tensor_parallel_where_needed():
    config = app_configs(load_serve_config(REPO / "configs/prod.yaml"))["llm"]
    options = {model.name: model.deployment.serve_options() for model in config.models}
    gpu_models = [model for model in config.models if options[model.name]["ray_actor_options"].get("num_gpus")
                  or options[model.name].get("placement_group_bundles")]
    assert {model.name for model in config.models} - {model.name for model in gpu_models} == {"smollm2-135m-instruct"}
    for model in gpu_models:
        assert model.engine.quantization == "fp8"
        gpus = options[model.name]["ray_actor_options"].get("num_gpus", 0) + sum(
            bundle.get("GPU", 0) for bundle in options[model.name].get("placement_group_bundles") or []
        )
        assert gpus == model.engine.tensor_parallel_size
    assert max(model.engine.tensor_parallel_size for model in config.models) > 1


def test_queue_autoscaling_needs_the_application_policy():
    raw = load_serve_config(REPO / "configs/prod.yaml")
    app = raw["applications"][0]
    built = build_from_config(app_configs(raw)["llm"])
    assert built is not None
    del app["autoscaling_policy"]
    with pytest.raises(ValueError, match="queue_autoscaling needs autoscaling_policy"):
        app_configs(raw)


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


@pytest.mark.parametrize(
    "options, needle",
    [
        ({"max_ongoing_requestz": 3}, "unknown Serve option max_ongoing_requestz"),
        ({"ray_actor_options": {"num_cpu": 1}}, "unknown Serve option ray_actor_options.num_cpu"),
        ({"autoscaling_config": {"min_replica": 1}}, "unknown Serve option autoscaling_config.min_replica"),
        ({"health_check_period_s": "often"}, "health_check_period_s"),
    ],
)
def test_serve_options_are_checked_by_serve_and_unknown_keys_named(options, needle):
    with pytest.raises(ValidationError, match=needle):
        DeploymentOptions.model_validate(options)


def test_serve_options_pass_through_as_written():
    options = DeploymentOptions.model_validate(
        {"max_queued_requests": 12, "ray_actor_options": {"num_cpus": 2}, "graceful_shutdown_timeout_s": 5}
    ).serve_options()
    assert options == {"num_replicas": 1, "max_ongoing_requests": 64, "max_queued_requests": 12,
                       "ray_actor_options": {"num_cpus": 2}, "graceful_shutdown_timeout_s": 5}


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
    assert "max_model_len" not in kwargs and "cpu_kv_cache_gib" not in kwargs and "cpu_isolate_workers" not in kwargs


def with_pools(pools: list[dict]) -> dict:
    args = minimal()
    args["models"][0]["pools"] = pools
    return args


def test_pools_merge_engine_overrides_and_fall_back_to_the_model_deployment():
    args = with_pools([
        {"name": "short", "max_output_tokens": 64, "engine": {"max_num_seqs": 128}},
        {"name": "long", "deployment": {"max_ongoing_requests": 8}},
    ])
    model = AppConfig.model_validate(args).models[0]
    short, long = model.pools
    assert model.pool_engine(short).max_num_seqs == 128 and model.pool_engine(long).max_num_seqs == 256
    assert model.pool_deployment(short) == model.deployment
    assert model.pool_deployment(long).max_ongoing_requests == 8


@pytest.mark.parametrize(
    "pools, needle",
    [
        ([{"name": "a", "max_output_tokens": 64}], "must leave max_output_tokens unset"),
        ([{"name": "a", "max_output_tokens": 64}, {"name": "a"}], "unique"),
        ([{"name": "a", "max_output_tokens": 64}, {"name": "b", "max_output_tokens": 32}, {"name": "c"}], "increasing"),
        ([{"name": "a", "engine": {"max_num_seq": 4}}], "pool a"),
        ([{"name": "Bad Name"}], "pools.0.name"),
    ],
)
def test_bad_pools_fail_at_load(pools, needle):
    with pytest.raises(ValidationError, match=needle):
        AppConfig.model_validate(with_pools(pools))


def test_empty_serve_config_is_refused():
    with pytest.raises(ValueError, match="no applications"):
        app_configs({"applications": []})


def test_an_ingress_deployment_block_overrides_only_the_keys_it_names():
    from serve_app.config import IngressConfig

    ingress = IngressConfig.model_validate({"deployment": {"num_replicas": 2, "max_queued_requests": 50,
                                                           "ray_actor_options": {"memory": 2**30}}})
    assert ingress.deployment.serve_options() == {
        "num_replicas": 2, "max_ongoing_requests": 1000, "max_queued_requests": 50,
        "ray_actor_options": {"num_cpus": 0, "memory": 2**30},
    }
    built = IngressConfig(deployment=DeploymentOptions(num_replicas=3))
    assert built.deployment.max_queued_requests == 1000 and built.deployment.num_replicas == 3
