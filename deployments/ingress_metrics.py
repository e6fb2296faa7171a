"""The ingress's Prometheus metrics (Ray exports them with a `ray_` prefix)."""

from __future__ import annotations

from collections import defaultdict

from ray.util import metrics

from serve_app.scheduling.types import RequestRecord

_LATENCY_BOUNDARIES = [0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128]
_TOKEN_BOUNDARIES = [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


class IngressMetrics:
    """The scheduler's observer: one set of metric objects per ingress replica."""

    def __init__(self) -> None:
        request_tags = ("model", "pool", "priority", "status")
        self.requests = metrics.Counter("serve_app_requests_total", "Requests by outcome.", request_tags)
        self.latency = metrics.Histogram(
            "serve_app_request_latency_seconds", "End-to-end latency.", _LATENCY_BOUNDARIES, ("model", "pool")
        )
        self.ttft = metrics.Histogram(
            "serve_app_ttft_seconds", "Time to first token.", _LATENCY_BOUNDARIES, ("model", "pool")
        )
        self.queue_wait = metrics.Histogram(
            "serve_app_queue_wait_seconds", "Time waited in the ingress queue.", _LATENCY_BOUNDARIES, ("model", "pool")
        )
        self.depth = metrics.Gauge("serve_app_queue_depth", "Requests waiting per pool.", ("model", "pool"))
        self.replicas = metrics.Gauge(
            "serve_app_replicas", "Running replicas per pool and capacity type.", ("model", "pool", "capacity_type")
        )
        token_tags = ("model", "pool")
        self.output_tokens = metrics.Counter("serve_app_output_tokens_total", "Output tokens.", token_tags)
        self.prompt_tokens = metrics.Counter("serve_app_prompt_tokens_total", "Prompt tokens.", token_tags)
        self.predicted = metrics.Histogram(
            "serve_app_predicted_output_tokens", "Predicted output length.", _TOKEN_BOUNDARIES, ("model", "pool")
        )
        self.prediction_error = metrics.Histogram(
            "serve_app_prediction_error_tokens",
            "|actual - predicted| output tokens; direction: under (ran longer) or over.",
            [1, *_TOKEN_BOUNDARIES],
            ("model", "pool", "direction"),
        )
        self.resumed = metrics.Counter("serve_app_streams_resumed_total", "Attempts resuming a started stream.", ("model",))
        self.cost_total = metrics.Counter(
            "serve_app_cost_usd_total", "Replica cost metered, USD.", ("model", "capacity_type")
        )
        self.cost_per_1k = metrics.Gauge(
            "serve_app_cost_per_1k_requests_usd", "Cost per 1000 requests so far, USD.", ("model",)
        )
        self._cost_seen: dict[tuple[str, str], float] = {}
        self.resent = metrics.Counter("serve_app_requests_resent_total", "Attempts re-sending an unstarted request.", ("model",))

    def dispatched(self, model: str, pool: str, wait_s: float) -> None:
        self.queue_wait.observe(wait_s, {"model": model, "pool": pool})

    def queue_depth(self, model: str, pool: str, waiting: int) -> None:
        self.depth.set(waiting, {"model": model, "pool": pool})

    def pool_replicas(self, model: str, pool: str, capacity_type: str, running: int) -> None:
        self.replicas.set(running, {"model": model, "pool": pool, "capacity_type": capacity_type})

    def cost(self, report: dict) -> None:
        """Export a `CostMeter.report()`: the counter grows by what was metered since the last one."""
        totals: dict[tuple[str, str], float] = defaultdict(float)
        for group in report["groups"]:
            totals[(group["model"], group["capacity_type"])] += group["cost_usd"]
        for (model, capacity_type), total in totals.items():
            seen = self._cost_seen.get((model, capacity_type), 0.0)
            if total > seen:
                self.cost_total.inc(total - seen, {"model": model, "capacity_type": capacity_type})
                self._cost_seen[(model, capacity_type)] = total
        for model, tally in report["by_model"].items():
            if tally.get("cost_per_1k_requests_usd") is not None:
                self.cost_per_1k.set(tally["cost_per_1k_requests_usd"], {"model": model})

    def finished(self, record: RequestRecord) -> None:
        tags = {"model": record.model, "pool": record.pool}
        self.requests.inc(1, {**tags, "priority": record.priority, "status": record.status})
        model = {"model": record.model}
        if record.resumed:
            self.resumed.inc(record.resumed, model)
        if record.resent:
            self.resent.inc(record.resent, model)
        if record.status != "ok":
            return
        self.latency.observe(record.latency_s, tags)
        if record.ttft_s is not None:
            self.ttft.observe(record.ttft_s, tags)
        for counter, tokens in ((self.output_tokens, record.output_tokens), (self.prompt_tokens, record.prompt_tokens)):
            if tokens:
                counter.inc(tokens, tags)
        self.predicted.observe(record.predicted_tokens, tags)
        error = record.output_tokens - record.predicted_tokens
        self.prediction_error.observe(abs(error), {**tags, "direction": "under" if error > 0 else "over"})
