"""Spot/on-demand split of a pool and the pinning options (checked by Serve itself)."""

from __future__ import annotations

import math

import pytest
import ray
from ray import serve

from serve_app.capacity import MARKET_TYPE_LABEL, ON_DEMAND, SPOT
from serve_app.capacity.split import CapacitySplit, ReplicaBounds, pin_options


class Replica:
    pass


def fixed(n: int) -> ReplicaBounds:
    return ReplicaBounds(n, n)


@pytest.mark.parametrize(("total", "share", "on_demand", "spot"), [
    (10, 0.7, 3, 7), (3, 0.7, 1, 2), (1, 0.7, 1, 0), (4, 0.5, 2, 2), (5, 1.0, 0, 5), (5, 0.0, 5, 0),
])
def test_fixed_pool_split(total, share, on_demand, spot):
    sides = CapacitySplit(share).split(fixed(total))
    assert sides.get(ON_DEMAND) == (fixed(on_demand) if on_demand else None)
    assert sides.get(SPOT) == (fixed(spot) if spot else None)


def test_on_demand_baseline_is_rounded_up_and_parts_add_up():
    for share in (0.1, 0.3, 0.5, 0.65, 0.7, 0.9):
        for total in range(0, 25):
            sides = CapacitySplit(share).split(fixed(total))
            on_demand = sides.get(ON_DEMAND, fixed(0)).max_replicas
            spot = sides.get(SPOT, fixed(0)).max_replicas
            assert on_demand + spot == total
            assert on_demand >= (1 - share) * total - 1e-9
            assert on_demand - 1 < (1 - share) * total


def test_autoscaling_bounds_split_each_bound_and_stay_ordered():
    for share in (0.3, 0.5, 0.7):
        for low in range(0, 6):
            for high in range(max(low, 1), 12):
                bounds = ReplicaBounds(low, high, initial_replicas=(low + high) // 2, autoscaling=True)
                sides = CapacitySplit(share).split(bounds)
                assert sum(side.max_replicas for side in sides.values()) == high
                assert sum(side.min_replicas for side in sides.values()) == low
                for side in sides.values():
                    assert side.autoscaling and side.min_replicas <= side.initial_replicas <= side.max_replicas
                assert sides[ON_DEMAND].min_replicas == math.ceil(round((1 - share) * low, 9))


def test_spot_share_zero_gives_no_spot_deployment():
    options = {"num_replicas": 4, "ray_actor_options": {"num_cpus": 1}}
    split = CapacitySplit(0.0).serve_options(options)
    assert list(split) == [ON_DEMAND] and split[ON_DEMAND]["num_replicas"] == 4


def test_zero_replicas_keeps_one_empty_on_demand_deployment():
    assert CapacitySplit(0.7).split(fixed(0)) == {ON_DEMAND: fixed(0)}


def test_share_out_of_range_is_refused():
    with pytest.raises(ValueError):
        CapacitySplit(1.5)


def test_serve_options_pin_each_side_and_spot_falls_back_to_on_demand():
    options = {
        "autoscaling_config": {"min_replicas": 2, "max_replicas": 10, "target_ongoing_requests": 8},
        "max_ongoing_requests": 64,
        "ray_actor_options": {"num_cpus": 1, "label_selector": {"ray.io/accelerator-type": "L4"}},
    }
    split = CapacitySplit(0.7).serve_options(options)
    on_demand, spot = split[ON_DEMAND], split[SPOT]
    assert on_demand["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 8}
    assert spot["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 7, "target_ongoing_requests": 8}
    assert on_demand["ray_actor_options"] == {
        "num_cpus": 1, "label_selector": {"ray.io/accelerator-type": "L4", MARKET_TYPE_LABEL: ON_DEMAND},
    }
    assert "fallback_strategy" not in on_demand["ray_actor_options"]
    assert spot["ray_actor_options"]["label_selector"] == {"ray.io/accelerator-type": "L4", MARKET_TYPE_LABEL: SPOT}
    assert spot["ray_actor_options"]["fallback_strategy"] == [
        {"label_selector": {"ray.io/accelerator-type": "L4", MARKET_TYPE_LABEL: ON_DEMAND}}
    ]
    assert options["ray_actor_options"]["label_selector"] == {"ray.io/accelerator-type": "L4"}, "input untouched"
    for side in split.values():
        serve.deployment(Replica).options(**side)  # Serve validates ray_actor_options here


def test_market_type_label_is_the_one_ray_sets_from_the_pod_environment():
    """KubeRay pods with RAY_NODE_MARKET_TYPE get this label without listing it."""
    assert MARKET_TYPE_LABEL == ray._raylet.RAY_NODE_MARKET_TYPE_KEY


def test_placement_group_pools_are_pinned_per_bundle():
    options = {
        "num_replicas": 2,
        "ray_actor_options": {"num_cpus": 1},
        "placement_group_bundles": [{"CPU": 1, "GPU": 1}, {"GPU": 1}],
        "placement_group_strategy": "STRICT_PACK",
    }
    spot = pin_options(SPOT, options)
    assert spot["placement_group_bundle_label_selector"] == [{MARKET_TYPE_LABEL: SPOT}]
    assert "label_selector" not in spot["ray_actor_options"]
    serve.deployment(Replica).options(**spot)


def test_serve_validation_checks_the_fallback_shape():
    """The checks above can fail: Serve refuses a fallback it cannot honour."""
    with pytest.raises(ValueError, match="Only \\['label_selector'\\]"):
        serve.deployment(Replica).options(ray_actor_options={"fallback_strategy": [{"resources": {"x": 1}}]})
