"""24 hours of diurnal traffic through three ways of sizing one LLM pool, in seconds.

    python benchmarks/diurnal_sim.py --measured results/throughput.json   # writes benchmarks/results/diurnal_sim.{json,png}
    python benchmarks/diurnal_sim.py --peak-rps 80 --startup-s 300        # assumed service rate (said on its face)

One seeded Poisson arrival trace (`DIURNAL_SHAPE`: peak/trough ~9x, evening peak) is served by a
pool modelled per second: each replica runs up to `slots` requests at once; how fast they
decode depends on how many share a replica (`LoadCurve`: one replica's output tok/s by
concurrent streams, from the throughput benchmark's JSON, `serve_app.cost.measured`), so
latency grows with load; requests wait FIFO for a slot; the router spreads streams evenly
over replicas; a new replica serves `startup_s` after it is asked for; a removed one
finishes its requests (and is billed) first. A request meets the SLO when its queue
wait plus decode time is within `slo_s`. The pool is sized by
- `queue-duration`: `serve_app.autoscaling.policy.QueueDurationPolicy` on the p90 wait
  of the last `signal_window_s` (raised to the oldest waiting request's age);
- `ray-stock`: Ray Serve's own `replica_queue_length_autoscaling_policy`, the real
  function, called with `AutoscalingContext`s built here, then Ray's scaling
  factors and delay logic (`_apply_scaling_factors`, `_apply_delay_logic`, with
  the simulated clock) and bounds, as the controller's wrapper applies them;
  its `total_num_requests` is the look-back mean of queued + running requests;
- `always-on`: on-demand replicas for the peak, all day.
Cost comes from `CostMeter` over the price book (on-demand `instance_type`).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
from ray.serve._private.common import DeploymentID
from ray.serve.autoscaling_policy import (
    _apply_delay_logic,
    _apply_scaling_factors,
    _get_cold_start_scale_up_replicas,
    replica_queue_length_autoscaling_policy,
)
from ray.serve.config import AutoscalingConfig, AutoscalingContext

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.report import write_json  # noqa: E402
from serve_app.autoscaling.policy import PoolSnapshot, QueueDurationPolicy, ScalingState  # noqa: E402
from serve_app.config import PriceTable, QueueDurationAutoscaling, ReplicaShape  # noqa: E402
from serve_app.cost.measured import LoadCurve, read_baseline  # noqa: E402
from serve_app.cost.meter import CostMeter  # noqa: E402
from serve_app.cost.plan import DIURNAL_SHAPE  # noqa: E402
from serve_app.quantile import quantile  # noqa: E402

DAY_S = 86_400
GROUP = ("sim-model", "default", "on-demand")
ASSUMED_CURVE = LoadCurve(
    tuple((n, n / (0.01624 + 0.00043 * n)) for n in (1, 2, 4, 8, 16, 32)),
    "ASSUMED, not measured (no --measured file): decode step 16.2 ms + 0.43 ms per stream, "
    "60 tok/s for one stream, 1067 tok/s at 32",
)
"""The service rate without a measured file (200 tokens: 3.3 s alone, 6 s with 32 streams)."""


@dataclass
class SimConfig:
    peak_rps: float = 40.0
    """Request rate at the evening peak."""
    slots: int = 32
    """Requests one replica serves at once (its `max_ongoing_requests`)."""
    curve: LoadCurve = ASSUMED_CURVE
    """One replica's output tok/s by concurrent streams (measured, or `ASSUMED_CURVE`)."""
    startup_s: float = 120.0
    """Seconds from asking for a replica to it serving (node + model load)."""
    slo_s: float = 10.0
    """Latency SLO: queue wait + decode."""
    prompt_tokens: int = 400
    """Prompt tokens per request (cost attribution only)."""
    output_tokens: int = 200
    """Output tokens per request."""
    signal_window_s: float = 30.0
    """Waits of requests dispatched this recently make the queue-duration signal."""
    instance_type: str = "g6e.xlarge"
    """What a replica runs on, priced on-demand from the price book."""
    always_on_utilization: float = 0.9
    """The always-on pool is sized so the peak fills its slots this much."""
    ray_target_ongoing_requests: float = 24.0
    """Ray stock policy target per replica (Ray's default of 2 would buy ~16x more;
    3/4 of the slots is a tuned setting)."""
    ray_look_back_s: float = 30.0
    """Ray stock policy's look-back window."""
    seed: int = 0
    """Seed of the arrival trace."""
    policy: QueueDurationAutoscaling = field(default_factory=lambda: QueueDurationAutoscaling(
        target_queue_wait_s=1.0, upscale_delay_s=15, downscale_delay_s=300, max_step_up=2, max_step_down=1,
        scale_from_zero_delay_s=10, idle_to_zero_delay_s=600, min_replicas=0, max_replicas=16))
    """The queue-duration policy's settings."""

    def rate_at(self, t: float) -> float:
        """Requests/s at second `t` of the day (hourly shape, linearly interpolated)."""
        hour = (t / 3600) % 24
        low = int(hour)
        frac = hour - low
        return self.peak_rps * (DIURNAL_SHAPE[low] * (1 - frac) + DIURNAL_SHAPE[(low + 1) % 24] * frac)

    def arrivals(self) -> np.ndarray:
        rates = np.array([self.rate_at(t + 0.5) for t in range(DAY_S)])
        return np.random.default_rng(self.seed).poisson(rates)

    def replica_rps(self) -> float:
        """Requests/s one replica finishes with all its slots busy."""
        return self.curve.tokens_per_s(self.slots) / self.output_tokens


class Pool:
    """Replicas, the FIFO queue of arrival cohorts, and requests in service. Every
    stream in service decodes at the same speed (`decoded` counts its tokens), so
    cohorts finish in the order they started."""

    def __init__(self, cfg: SimConfig, replicas: int) -> None:
        self.cfg = cfg
        self.ready = replicas
        self.starting: deque[float] = deque()  # ready times
        self.draining: deque[float] = deque()  # billing end times
        self.queue: deque[list] = deque()  # [arrival second, count]
        self.queued = 0
        self.decoded = 0.0
        self.in_service: deque[list] = deque()  # [`decoded` at finish, count, arrival second]
        self.serving = 0
        self.recent: deque[tuple[float, float, int]] = deque()  # (start second, wait, count)
        self.served = self.within_slo = 0
        self.latency_counts: dict[int, int] = {}  # finished requests by latency, 0.1 s bins
        self.wait_counts: dict[int, int] = {}  # started requests by wait, 1 s bins

    @property
    def target(self) -> int:
        return self.ready + len(self.starting)

    @property
    def billed(self) -> int:
        return self.target + len(self.draining)

    def stream_tok_s(self) -> float:
        """Each stream's decode speed now: the streams in service spread over the replicas holding them."""
        return self.cfg.curve.per_stream_tok_s(self.serving / max(1, self.ready + len(self.draining)))

    def set_target(self, now: float, target: int) -> None:
        while self.target < target:
            self.starting.append(now + self.cfg.startup_s)
        while self.target > target:
            if self.starting:
                self.starting.pop()
            else:
                self.ready -= 1
                last = self.in_service[-1][0] - self.decoded if self.in_service else 0.0
                self.draining.append(now + last / self.stream_tok_s())

    def step(self, now: float, arrivals: int) -> int:
        """One second: replicas come and go, streams decode over the second before
        `now` and finish, requests arrive and start. Returns the requests finished."""
        while self.starting and self.starting[0] <= now:
            self.starting.popleft()
            self.ready += 1
        while self.draining and self.draining[0] <= now:
            self.draining.popleft()
        speed = self.stream_tok_s()
        before, self.decoded = self.decoded, self.decoded + speed
        finished = 0
        while self.in_service and self.in_service[0][0] <= self.decoded + 1e-6:  # float sums of the speed
            done_at, count, arrived = self.in_service.popleft()
            latency = now - 1 + (done_at - before) / speed - arrived
            self.latency_counts[int(latency * 10)] = self.latency_counts.get(int(latency * 10), 0) + count
            self.within_slo += count if latency <= self.cfg.slo_s else 0
            finished += count
        self.serving -= finished
        self.served += finished
        if arrivals:
            self.queue.append([now, arrivals])
            self.queued += arrivals
        free = self.ready * self.cfg.slots - self.serving
        while free > 0 and self.queue:
            cohort = self.queue[0]
            count = min(free, cohort[1])
            wait = now - cohort[0]
            self.in_service.append([self.decoded + self.cfg.output_tokens, count, cohort[0]])
            self.recent.append((now, wait, count))
            self.wait_counts[int(wait)] = self.wait_counts.get(int(wait), 0) + count
            free -= count
            self.serving += count
            self.queued -= count
            cohort[1] -= count
            if not cohort[1]:
                self.queue.popleft()
        while self.recent and self.recent[0][0] < now - self.cfg.signal_window_s:
            self.recent.popleft()
        return finished

    def missed_unfinished(self, now: float) -> int:
        """Requests not finished at `now` that are already past the SLO."""
        return sum(c[1] for c in self.queue if now - c[0] > self.cfg.slo_s) + sum(
            c[1] for c in self.in_service if now - c[2] > self.cfg.slo_s)

    def wait_signal(self, now: float) -> float:
        """p90 of recent waits, raised to the oldest waiting request's age."""
        oldest = now - self.queue[0][0] if self.queue else 0.0
        if not any(wait for _, wait, _ in self.recent):  # the common case: nobody waited
            return oldest
        p90 = quantile([wait for _, wait, count in self.recent for _ in range(count)], 0.9)
        return max(p90, oldest)


class Scaler(Protocol):
    name: str

    def decide(self, now: float, pool: Pool) -> int: ...


class QueueScaler:
    name = "queue-duration"

    def __init__(self, cfg: SimConfig) -> None:
        self._policy = QueueDurationPolicy(cfg.policy)
        self._state = ScalingState()

    def decide(self, now: float, pool: Pool) -> int:
        snap = PoolSnapshot(now=now, replicas=pool.target, running=pool.ready, signal_s=pool.wait_signal(now),
                            queued=pool.queued, in_flight=pool.serving, slots=pool.ready * pool.cfg.slots)
        decision = self._policy.decide(snap, self._state)
        self._state = decision.state
        return decision.replicas


class RayStockScaler:
    name = "ray-stock"

    def __init__(self, cfg: SimConfig) -> None:
        self._config = AutoscalingConfig(
            min_replicas=cfg.policy.min_replicas, max_replicas=cfg.policy.max_replicas,
            target_ongoing_requests=cfg.ray_target_ongoing_requests, look_back_period_s=cfg.ray_look_back_s)
        self._id = DeploymentID(name="LLMServer-sim-model-default", app_name="sim")
        self._window: deque[float] = deque(maxlen=int(cfg.ray_look_back_s))
        self._state: dict = {}

    def decide(self, now: float, pool: Pool) -> int:
        self._window.append(pool.queued + pool.serving)
        ctx = AutoscalingContext(
            deployment_id=self._id, deployment_name=self._id.name, app_name="sim",
            current_num_replicas=pool.ready, target_num_replicas=pool.target, running_replicas=[],
            total_num_requests=sum(self._window) / len(self._window), total_queued_requests=pool.queued,
            aggregated_metrics={}, raw_metrics={}, capacity_adjusted_min_replicas=self._config.min_replicas,
            capacity_adjusted_max_replicas=self._config.max_replicas, policy_state=dict(self._state),
            last_scale_up_time=None, last_scale_down_time=None, current_time=now, config=self._config)
        decision = _get_cold_start_scale_up_replicas(ctx)
        if decision is None:
            desired, _ = replica_queue_length_autoscaling_policy(ctx)
            desired = _apply_scaling_factors(desired, ctx.current_num_replicas, self._config)
            if ctx.current_num_replicas == 0 and desired > 0:
                decision = desired
            else:
                decision, self._state = _apply_delay_logic(max(0, desired), ctx.target_num_replicas,
                                                           self._config, self._state, _now=now)
        return max(self._config.min_replicas, min(self._config.max_replicas, math.ceil(decision)))


class FixedScaler:
    name = "always-on"

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas

    def decide(self, now: float, pool: Pool) -> int:
        return self.replicas


def peak_replicas(cfg: SimConfig) -> int:
    return math.ceil(cfg.peak_rps / cfg.replica_rps() / cfg.always_on_utilization)


def histogram_quantile(counts: dict[int, int], bin_s: float, q: float) -> float | None:
    """The `q` quantile of values binned by `bin_s` seconds (None when empty)."""
    values = [key * bin_s for key in sorted(counts) for _ in range(counts[key])]
    return round(quantile(values, q), 3) if values else None


def simulate(cfg: SimConfig, scaler: Scaler, arrivals: np.ndarray, prices: PriceTable,
             progress: bool = False) -> dict:
    """One day of `arrivals` (requests per second) through a pool sized by `scaler`,
    starting from the replicas midnight traffic needs (the always-on pool: its own)."""
    start = scaler.replicas if isinstance(scaler, FixedScaler) else math.ceil(cfg.rate_at(0) / cfg.replica_rps())
    pool = Pool(cfg, replicas=start)
    meter = CostMeter(prices, start=0.0)
    meter.sample(0.0, {GROUP: pool.billed})
    billed, per_minute = pool.billed, []
    for second, arriving in enumerate(arrivals.tolist()):
        now = float(second)
        finished = pool.step(now, arriving)
        if finished:
            meter.record(*GROUP, prompt_tokens=finished * cfg.prompt_tokens,
                         output_tokens=finished * cfg.output_tokens, requests=finished)
        pool.set_target(now, scaler.decide(now, pool))
        if pool.billed != billed or second % 60 == 0:
            billed = pool.billed
            meter.sample(now, {GROUP: billed})
        if second % 60 == 0:
            per_minute.append(pool.billed)
        if progress and second % (4 * 3600) == 0:
            print(f"  [{scaler.name}] {second // 3600:02d}:00  replicas={pool.target}  queued={pool.queued}",
                  flush=True)
    end = float(len(arrivals))
    cost = meter.report(end)
    judged = pool.served + pool.missed_unfinished(end)  # the rest may still make it
    attainment = pool.within_slo / judged if judged else 1.0
    return {
        "policy": scaler.name,
        "requests": int(arrivals.sum()),
        "served": pool.served,
        "queued_at_end": pool.queued,
        "in_service_at_end": pool.serving,
        "replica_hours": cost["replica_hours"],
        "cost_usd": cost["cost_usd"],
        "idle_usd": cost["idle_usd"],
        "cost_per_1k_requests_usd": cost["cost_per_1k_requests_usd"],
        "cost_per_1m_output_tokens_usd": cost["cost_per_1m_output_tokens_usd"],
        "prices": cost["prices"],
        "slo_attainment": round(attainment, 5),
        "over_slo_share": round(1 - attainment, 5),
        "latency_p50_s": histogram_quantile(pool.latency_counts, 0.1, 0.5),
        "latency_p99_s": histogram_quantile(pool.latency_counts, 0.1, 0.99),
        "wait_p99_s": histogram_quantile(pool.wait_counts, 1.0, 0.99),
        "max_replicas": max(per_minute),
        "replicas_per_minute": per_minute,
    }


def run_all(cfg: SimConfig, progress: bool = False) -> dict:
    prices = PriceTable(replicas={GROUP[0]: ReplicaShape(instance_type=cfg.instance_type)})
    arrivals = cfg.arrivals()
    scalers: list[Scaler] = [QueueScaler(cfg), RayStockScaler(cfg), FixedScaler(peak_replicas(cfg))]
    return {
        "config": {**asdict(cfg), "policy": cfg.policy.model_dump()},
        "service": {"source": cfg.curve.source, "replica_rps_all_slots_busy": round(cfg.replica_rps(), 4),
                    "latency_all_slots_busy_s": round(cfg.output_tokens / cfg.curve.per_stream_tok_s(cfg.slots), 3)},
        "trace": {"requests": int(arrivals.sum()), "peak_rps": cfg.peak_rps,
                  "trough_rps": round(cfg.peak_rps * min(DIURNAL_SHAPE), 2),
                  "peak_to_trough": round(max(DIURNAL_SHAPE) / min(DIURNAL_SHAPE), 2),
                  "rps_per_minute": [round(cfg.rate_at(60 * m), 3) for m in range(DAY_S // 60)]},
        "results": [simulate(cfg, scaler, arrivals, prices, progress) for scaler in scalers],
    }


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = np.arange(DAY_S // 60) / 60
    fig, (top, bottom, bars) = plt.subplots(3, 1, figsize=(11, 10), gridspec_kw={"height_ratios": [1, 1.4, 1]})
    top.plot(hours, summary["trace"]["rps_per_minute"], color="black")
    top.set_ylabel("requests/s")
    top.set_title(f"diurnal trace: {summary['trace']['requests']:,} requests, "
                  f"peak/trough {summary['trace']['peak_to_trough']}x\nservice rate: {summary['service']['source']}",
                  fontsize=9)
    for result in summary["results"]:
        bottom.step(hours, result["replicas_per_minute"], where="post", label=result["policy"])
    bottom.set_ylabel("billed replicas")
    bottom.set_xlabel("hour of day")
    bottom.legend()
    names = [r["policy"] for r in summary["results"]]
    xs = np.arange(len(names))
    as_of = ", ".join(summary["results"][0]["prices"]["as_of"])
    costs = [r["cost_usd"] for r in summary["results"]]
    bars.bar(xs - 0.2, costs, 0.4, label=f"cost (USD/day, prices as of {as_of})")
    bars.set_ylabel("USD per day")
    bars.set_ylim(0, 1.5 * max(costs))
    slo = bars.twinx()
    slo.bar(xs + 0.2, [100 * r["slo_attainment"] for r in summary["results"]], 0.4, color="tab:green",
            label=f"% requests within the {summary['config']['slo_s']:g} s SLO")
    slo.set_ylabel("% within SLO")
    slo.set_ylim(0, 150)
    bars.set_xticks(xs, names)
    bars.legend(loc="upper left")
    slo.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", type=Path, help="throughput benchmark JSON giving the service rate "
                                                      "(default: an assumed rate, said so in the output)")
    parser.add_argument("--target", help="which result of --measured (default: the first)")
    parser.add_argument("--peak-rps", type=float, default=SimConfig.peak_rps)
    parser.add_argument("--slots", type=int, default=SimConfig.slots)
    parser.add_argument("--output-tokens", type=int, default=SimConfig.output_tokens)
    parser.add_argument("--startup-s", type=float, default=SimConfig.startup_s)
    parser.add_argument("--slo-s", type=float, default=SimConfig.slo_s)
    parser.add_argument("--instance-type", default=SimConfig.instance_type)
    parser.add_argument("--seed", type=int, default=SimConfig.seed)
    parser.add_argument("--out", default="benchmarks/results/diurnal_sim")
    args = parser.parse_args(argv)
    curve = ASSUMED_CURVE
    if args.measured:
        curve = read_baseline(args.measured, args.target).curve
        if curve is None:
            parser.error(f"{args.measured} gives no concurrency (workload.concurrency or a load_curve)")
    cfg = SimConfig(peak_rps=args.peak_rps, slots=args.slots, curve=curve, output_tokens=args.output_tokens,
                    startup_s=args.startup_s, slo_s=args.slo_s, instance_type=args.instance_type, seed=args.seed)
    print(f"service rate: {curve.source}; {cfg.replica_rps():.3f} req/s per replica with {cfg.slots} slots busy")
    summary = run_all(cfg, progress=True)
    out = REPO / args.out
    write_json(out.with_suffix(".json"), summary, {})
    plot(summary, out.with_suffix(".png"))
    print(f"\n{'policy':<16}{'replica-h':>10}{'USD/day':>10}{'USD/1k req':>12}{'in SLO':>9}"
          f"{'lat p50':>9}{'lat p99':>9}{'max repl':>10}")
    for r in summary["results"]:
        print(f"{r['policy']:<16}{r['replica_hours']:>10.1f}{r['cost_usd']:>10.2f}"
              f"{r['cost_per_1k_requests_usd']:>12.4f}{100 * r['slo_attainment']:>8.2f}%"
              f"{r['latency_p50_s']:>8.1f}s{r['latency_p99_s']:>8.1f}s{r['max_replicas']:>10}")
    print(f"prices: {cfg.instance_type} on-demand as of {', '.join(summary['results'][0]['prices']['as_of'])}")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
