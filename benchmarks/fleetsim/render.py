"""The fleet simulator's result files as README and docs tables: its validation
against this machine, and its projections (routing, Spot)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from benchmarks.report import fmt, where


def validation_rows(path: str, data: Mapping[str, Any]) -> list[str]:
    """Per system, the simulator's worst error within each target (10% on tok/s and p50s, 20% on p99s)."""
    rows, at = [], where(path, data)
    for system, checks in data["comparison"].items():
        for limit in sorted({c["target"] for c in checks.values()}):
            judged = {name: c for name, c in checks.items() if c["target"] == limit}
            name, worst = max(judged.items(), key=lambda item: abs(item[1]["error"]))
            verdict = "within" if all(c["pass"] for c in judged.values()) else "MISSES"
            rows.append(f"| simulator against measured, {system}: worst of {', '.join(judged)} | "
                        f"{name} {worst['error']:+.1%} ({verdict} {limit:.0%}) | one replay | {at} |")
    return rows


def validation_table(comparison: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    rows = ["| system | metric | measured (median) | simulated | error | target |", "|---|---|---|---|---|---|"]
    rows += [f"| `{system}` | {name} | {fmt(c['measured'])} | {fmt(c['simulated'])} | {c['error']:+.1%} | "
             f"{'within' if c['pass'] else 'MISSES'} {c['target']:.0%} |"
             for system, checks in comparison.items() for name, c in checks.items()]
    return "\n".join(rows)


def routing_rows(path: str, data: Mapping[str, Any]) -> list[str]:
    """Per load, the app's short-request E2E p99 and goodput over Serve's defaults' (projected)."""
    app, serve = data["results"]["app"], data["results"]["serve-default"]
    fleet, at = f"{data['replicas']} x {data['engine']['name']}", where(path, data)
    rows = []
    for load in data["loads"]:
        mine, theirs = app[str(load)], serve[str(load)]
        short = mine["short_e2el_s"]["p99"] / theirs["short_e2el_s"]["p99"]
        goodput = mine["goodput"] / theirs["goodput"] if theirs["goodput"] else None
        rows.append(f"| PROJECTED routing, {fleet} at {load} load: short E2E p99, goodput app/serve-default | "
                    f"{fmt(short)}, {fmt(goodput)} | one simulated run | {at} |")
    return rows


def routing_table(data: Mapping[str, Any]) -> str:
    rows = ["| load | system | output tok/s | TTFT p50 / p99 (s) | E2E p50 / p99 (s) | short E2E p99 (s) | goodput (req/s) "
            "| USD / 1M output tokens |", "|---|---|---|---|---|---|---|---|"]
    rows += [f"| {load} | `{system}` | {fmt(r['output_throughput'])} | {fmt(r['ttft_s']['p50'])} / {fmt(r['ttft_s']['p99'])} "
             f"| {fmt(r['e2el_s']['p50'])} / {fmt(r['e2el_s']['p99'])} | {fmt(r['short_e2el_s']['p99'])} "
             f"| {fmt(r['goodput'])} | {fmt(r.get('usd_per_1m_output_tokens'))} |"
             for load in data["loads"] for system, by_load in data["results"].items() for r in [by_load[str(load)]]]
    source = data["engine"]["step_time"]["source"]
    price = data.get("price")
    priced = (f"; priced at {fmt(price['usd_per_gpu_hour'])} USD per GPU-hour ({price['instance_type']} on demand, "
              f"{price['region']}, {price['as_of']}: {price['source']})" if price else "")
    table = (f"Projected, not measured: {data['replicas']} replicas, capacity {fmt(data['capacity_req_per_s'])} req/s; "
             f"step time from {source}{priced}.\n\n" + "\n".join(rows))
    if not data.get("h100_trained_vs_roofline"):
        return table
    check = ["| H100 step | BLIS trained (ms) | BLIS roofline (ms) | roofline / trained |", "|---|---|---|---|"]
    check += [f"| {shape} | {fmt(c['trained_ms'])} | {fmt(c['roofline_ms'])} | {fmt(c['roofline_over_trained'])} |"
              for shape, c in data["h100_trained_vs_roofline"].items()]
    return table + "\n\n" + "\n".join(check)


def spot_rows(path: str, data: Mapping[str, Any]) -> list[str]:
    """Streams broken per interruption, and the app's cost at the worst Spot Advisor bucket over on-demand."""
    tolls, worst = data["per_interruption"], data["spot_advisor"][list(data["spot_advisor"])[-1]]
    fleet, at = f"{data['replicas']} x {data['engine']['name']}", where(path, data)
    cost = worst["spot-resume"]["usd_per_1m_output_tokens"] / data["on_demand_usd_per_1m_output_tokens"]
    by_seed = list(data["within_slo_by_seed"].values())

    def spread(name: str) -> str:
        shares = sorted(seed[name] for seed in by_seed)
        return f"{shares[len(shares) // 2]:.1%} [{shares[0]:.1%}-{shares[-1]:.1%}]"

    return [f"| PROJECTED Spot, {fleet}, {len(data['interruptions'])} notices: requests within the SLO, "
            f"{' / '.join(data['results'])} | {' / '.join(map(spread, data['results']))} | median [range] of "
            f"{len(by_seed)} notice draws | {at} |",
            f"| PROJECTED Spot, {fleet}: streams broken per interruption, resend / app | "
            f"{fmt(tolls['spot-resend']['streams_broken'])} / {fmt(tolls['spot-resume']['streams_broken'])} | "
            f"one simulated run | {at} |",
            f"| PROJECTED Spot, {fleet}: USD per 1M output tokens at the worst Spot Advisor bucket, app / on-demand | "
            f"{fmt(cost)} | one simulated run | {at} |"]


def spot_table(data: Mapping[str, Any]) -> str:
    rows = ["| system | failed | streams broken | within the SLO | E2E p50 / p99 (s) | prefill / decode tokens again "
            "per interruption | lost replica-s per interruption |", "|---|---|---|---|---|---|---|"]
    for name, r in data["results"].items():
        toll = data["per_interruption"].get(name, {})
        rows.append(f"| `{name}` | {r['failed']} | {r['streams_broken']} | {r['good_requests']}/{r['requests']} | "
                    f"{fmt(r['e2el_s']['p50'])} / {fmt(r['e2el_s']['p99'])} | {fmt(toll.get('prefill_tokens_again'))}"
                    f" / {fmt(toll.get('decode_tokens_again'))} | {fmt(toll.get('lost_work_replica_s'))} |")
    names = list(data["per_interruption"])
    costs = ["| Spot Advisor bucket (interruptions per month) | " + " | ".join(f"`{n}` USD / 1M" for n in names)
             + " |", "|---" * (len(names) + 1) + "|"]
    costs += [f"| {bucket} | " + " | ".join(fmt(row[n]["usd_per_1m_output_tokens"]) for n in names) + " |"
              for bucket, row in data["spot_advisor"].items()]
    price = data["price"]
    return (f"Projected, not measured: {data['replicas']} replicas, {len(data['interruptions'])} notices "
            f"({fmt(data['notice_s'])} s each), replacement after {fmt(data['replacement_s'])} s "
            f"({data['replacement_basis']}); on demand {fmt(data['on_demand_usd_per_1m_output_tokens'])} USD per 1M "
            f"output tokens; Spot {fmt(price['spot_usd_per_hour'])} USD/h ({price['spot_source']}, "
            f"{price['spot_as_of']}).\n\n" + "\n".join(rows) + "\n\n" + "\n".join(costs))
