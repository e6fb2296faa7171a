"""The one map from (model, pool, capacity type) to Serve deployment name, options and slots."""

import pytest

from serve_app.capacity import ANY_CAPACITY, ON_DEMAND, SPOT
from serve_app.config import AppConfig, app_configs, load_serve_config
from serve_app.topology import REQUEST_ROUTER_CONFIG, Topology, deployment_name, pool_of
from tests.conftest import REPO


def test_deployment_names_are_serve_safe():
    assert deployment_name("org/model:v1.5", "short") == "LLMServer-org-model-v1-5-short"


@pytest.mark.parametrize("side", [ANY_CAPACITY, SPOT, ON_DEMAND])
def test_a_name_maps_back_to_its_pool_and_side(side):
    assert pool_of(deployment_name("org/model-1", "long", side)) == (deployment_name("org/model-1", "long"), side)


def test_queue_autoscaled_pools_leave_delays_to_the_policy_and_spot_gets_the_notice_window():
    config = app_configs(load_serve_config(REPO / "configs/prod.yaml"))["llm"]
    model = config.models[0]
    sides = Topology(config).pool(model.name, model.pools[0].name)
    for side in sides.values():
        scaling = side.options["autoscaling_config"]
        assert scaling["upscale_delay_s"] == scaling["downscale_delay_s"] == 0
    assert sides[ON_DEMAND].options["autoscaling_config"]["min_replicas"] == 1
    assert sides[SPOT].options["autoscaling_config"]["max_replicas"] == 5
    window = config.preemption.notice_window_s - config.preemption.drain_margin_s
    assert sides[SPOT].options["graceful_shutdown_timeout_s"] == window


def test_pools_get_the_least_loaded_router_unless_they_name_one_and_slots_come_from_the_pool():
    config = AppConfig.model_validate({"models": [{
        "name": "m", "engine": {"model": "x"},
        "pools": [{"name": "short", "max_output_tokens": 64, "deployment": {"max_ongoing_requests": 8}},
                  {"name": "long", "deployment": {"request_router_config": {"request_routing_stats_period_s": 5}}}],
    }]})
    topology = Topology(config)
    short, long = topology.pool("m", "short")[ANY_CAPACITY], topology.pool("m", "long")[ANY_CAPACITY]
    assert short.options["request_router_config"] == REQUEST_ROUTER_CONFIG and short.slots_per_replica == 8
    assert long.options["request_router_config"] == {"request_routing_stats_period_s": 5}
    assert [d.name for d in topology.deployments] == ["LLMServer-m-short", "LLMServer-m-long"]


def test_replicas_get_serve_headroom_over_their_slots_and_run_at_normal_priority():
    config = AppConfig.model_validate({"models": [{
        "name": "m", "engine": {"model": "x"},
        "deployment": {"max_ongoing_requests": 32,
                       "ray_actor_options": {"num_cpus": 1, "runtime_env": {"env_vars": {"A": "1"}}}},
    }]})
    (deployment,) = Topology(config).deployments
    assert deployment.slots_per_replica == 32 and deployment.options["max_ongoing_requests"] == 40
    assert deployment.options["ray_actor_options"]["runtime_env"]["env_vars"] == {"RAY_worker_niceness": "0", "VLLM_CONFIGURE_LOGGING": "0", "A": "1"}
    assert config.models[0].deployment.serve_options()["ray_actor_options"]["runtime_env"]["env_vars"] == {"A": "1"}


def test_the_ingress_queue_in_serves_proxy_is_bounded_by_default():
    config = AppConfig.model_validate({"models": [{"name": "m", "engine": {"model": "x"}}]})
    assert Topology(config).ingress_options()["max_queued_requests"] == 1000


def test_slots_never_exceed_what_the_engine_runs_at_once():
    config = app_configs(load_serve_config(REPO / "configs/prod.yaml"))["llm"]
    model = config.models[0]  # its long pool: 256 ongoing requests over an engine of 128 sequences
    long = model.pool("long")
    assert model.pool_deployment(long).max_ongoing_requests > model.pool_engine(long).max_num_seqs
    for deployment in Topology(config).pool(model.name, "long").values():
        assert deployment.slots_per_replica == model.pool_engine(long).max_num_seqs == 128
        assert deployment.options["max_ongoing_requests"] == 160  # Serve's limit: the slots plus headroom


def test_prod_ingress_keeps_the_bounded_proxy_queue_under_its_own_deployment_block():
    config = app_configs(load_serve_config(REPO / "configs/prod.yaml"))["llm"]
    options = Topology(config).ingress_options()
    assert options["max_queued_requests"] == 1000 and options["max_ongoing_requests"] == 1000
    assert options["ray_actor_options"]["num_cpus"] == 1  # prod's own, merged over the default 0
    assert options["ray_actor_options"]["label_selector"]["ray.io/market-type"] == "on-demand"


def test_deployments_that_load_vllm_leave_serves_logging_alone(small_config):
    """vLLM's own logging setup closes every handler of the process, Serve's replica log too."""
    topology = Topology(small_config)
    ingress_env = topology.ingress_options()["ray_actor_options"]["runtime_env"]["env_vars"]
    pools = [d for model, pool in topology.pools() for d in topology.pool(model, pool).values()]
    assert ingress_env["VLLM_CONFIGURE_LOGGING"] == "0"
    assert all(d.options["ray_actor_options"]["runtime_env"]["env_vars"]["VLLM_CONFIGURE_LOGGING"] == "0"
               for d in pools)
