"""Per-request timings and summaries, as `vllm bench serve` defines them, on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.metrics import RequestRecord, Slo, StreamTimer, distribution, failed, rounded, summarize


def role(at):
    return {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, at


def content(text, at, finish=None):
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}, at


def usage_only(tokens, at):
    return {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": tokens}}, at


def timed(chunks, sent_at=10.0, origin=9.0, keep_text=False):
    timer = StreamTimer(sent_at, origin, keep_text)
    for data, at in chunks:
        if not timer.feed(data, at):
            break
    return timer.finish()


def test_ttft_itl_e2el_tpot_from_chunks_with_choices_only():
    # role chunk at +0.5, one token at +0.7, a 3-token chunk at +1.2, the finish chunk at +1.3,
    # then the usage-only chunk at +1.9 (it has no `choices`: it neither adds an ITL nor extends E2EL)
    record = timed([role(10.5), content("a", 10.7), content("bcd", 11.2), content("", 11.3, "length"),
                    usage_only(5, 11.9)], keep_text=True)
    assert record.ok and record.start_s == pytest.approx(1.0)
    assert record.ttft_s == pytest.approx(0.5)
    assert record.itl_s == pytest.approx([0.2, 0.5, 0.1])  # one gap per chunk, however many tokens it carries
    assert record.e2el_s == pytest.approx(1.3)
    assert (record.output_tokens, record.prompt_tokens) == (5, 7)  # from usage, not from counting chunks
    assert record.tpot_s == pytest.approx((1.3 - 0.5) / (5 - 1))
    assert record.text == "abcd"


def test_usage_in_a_chunk_with_choices_counts_too():
    data, at = content("x", 10.2, "stop")
    data["usage"] = {"completion_tokens": 1}
    record = timed([role(10.1), (data, at)])
    assert record.ok and record.output_tokens == 1 and record.tpot_s is None  # TPOT needs > 1 token


def test_stream_failures_have_a_status():
    error = ({"error": {"message": "replica lost"}}, 10.4)
    assert timed([role(10.1), content("a", 10.2), error, content("b", 10.5)]).status == "stream_error"
    assert timed([role(10.1), content("a", 10.2)]).status == "no_usage"
    assert timed([usage_only(3, 10.3)]).status == "no_first_chunk"
    refused = failed("http_429", 2.0, retry_after="1")
    assert (refused.ok, refused.status, refused.retry_after, refused.tpot_s) == (False, "http_429", "1", None)


def ok(ttft, e2el, tokens, itl=(), kind="all"):
    return RequestRecord(kind=kind, ttft_s=ttft, e2el_s=e2el, output_tokens=tokens, itl_s=list(itl))


def test_summary_by_hand():
    records = [ok(0.1, 1.1, 11, [0.1] * 10), ok(0.3, 2.3, 21, [0.1] * 20), ok(0.2, 0.2, 1),
               failed("http_503", retry_after="2"), failed("http_503"), failed("timeout"), failed("stream_error")]
    s = summarize(records, duration_s=10.0)
    assert (s["requests"], s["completed"], s["failed"]) == (7, 3, 4)
    assert s["failures"] == {"http_503": 2, "stream_error": 1, "timeout": 1}
    assert s["refused_without_retry_after"] == 1
    assert (s["output_tokens"], s["request_throughput"], s["output_throughput"]) == (33, 0.3, 3.3)
    assert s["ttft_s"]["mean"] == pytest.approx(0.2) and s["ttft_s"]["p50"] == pytest.approx(0.2)
    assert s["ttft_s"]["p90"] == pytest.approx(0.28)  # linear: 0.2 + 0.8 * (0.3 - 0.2)
    # TPOT only for > 1 token: (1.1 - 0.1) / 10 = 0.1 and (2.3 - 0.3) / 20 = 0.1
    assert s["tpot_s"]["p50"] == pytest.approx(0.1) and s["tpot_s"]["mean"] == pytest.approx(0.1)
    assert s["itl_s"]["p99"] == pytest.approx(0.1)
    assert s["e2el_s"]["p50"] == pytest.approx(1.1)
    assert s["goodput"] is None and s["good_requests"] is None


def test_percentiles_are_numpys_linear_interpolation():
    values = [0.9, 0.1, 5.0, 2.2, 0.4, 3.3, 1.7]
    got = distribution(values)
    assert got["mean"] == pytest.approx(np.mean(values))
    for p in (50, 90, 99):
        assert got[f"p{p}"] == pytest.approx(np.percentile(values, p))
    assert distribution([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_goodput_counts_requests_meeting_every_slo():
    records = [ok(0.5, 2.5, 21), ok(1.5, 2.5, 21), ok(0.5, 8.5, 21), ok(0.2, 0.2, 1), failed("timeout")]
    # TPOTs: 0.1, 0.05, 0.4, 0 (one token counts as TPOT 0 for goodput, as vLLM does)
    s = summarize(records, 2.0, Slo(ttft_s=1.0, tpot_s=0.2))
    assert s["good_requests"] == 2 and s["goodput"] == 1.0  # the 1st and the 1-token one
    assert summarize(records, 2.0, Slo(e2el_s=2.5))["good_requests"] == 3  # <= counts
    per_class = summarize([ok(0.5, 2.5, 21, kind="short"), ok(0.5, 2.5, 21, kind="long")], 1.0,
                          lambda r: Slo(e2el_s=1.0) if r.kind == "short" else Slo(ttft_s=1.0))
    assert per_class["good_requests"] == 1
    assert summarize(records, 2.0, Slo())["goodput"] is None  # no SLO given: not judged
    with pytest.raises(ValueError):
        summarize(records, 0.0)


def test_rounded_for_json():
    assert rounded({"a": [1.234567, float("nan")], "b": (2, 3.14159)}, 2) == {"a": [1.23, None], "b": [2, 3.14]}


@pytest.mark.slow
def test_same_numbers_as_vllm_bench_serve():
    """Cross-check with vLLM's own `calculate_metrics` (imports vLLM: ~15 s here)."""
    serve = pytest.importorskip("vllm.benchmarks.serve")
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    rng = np.random.default_rng(3)
    records, outputs = [], []
    for i in range(40):
        ttft = float(rng.uniform(0.05, 2.0))
        itl = [float(x) for x in rng.uniform(0.01, 0.3, size=int(rng.integers(0, 30)))]
        tokens = len(itl) + 1 + int(rng.integers(0, 3))  # multi-token chunks: more tokens than chunks
        e2el = ttft + sum(itl)
        records.append(ok(ttft, e2el, tokens, itl))
        outputs.append(RequestFuncOutput(success=True, latency=e2el, output_tokens=tokens, ttft=ttft, itl=itl,
                                         prompt_len=5, start_time=float(i)))
    records.append(failed("http_503"))
    outputs.append(RequestFuncOutput(success=False, error="503"))
    ours = summarize(records, 30.0, Slo(ttft_s=1.0, tpot_s=0.15))
    theirs, _ = serve.calculate_metrics([SampleRequest(prompt="p", prompt_len=5)] * len(outputs), outputs, 30.0,
                                        None, [50.0, 90.0, 99.0], {"ttft": 1000.0, "tpot": 150.0})
    assert ours["request_throughput"] == pytest.approx(theirs.request_throughput)
    assert ours["output_throughput"] == pytest.approx(theirs.output_throughput)
    assert ours["goodput"] == pytest.approx(theirs.request_goodput)
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert ours[f"{name}_s"]["mean"] * 1000 == pytest.approx(getattr(theirs, f"mean_{name}_ms"))
        for p, value in getattr(theirs, f"percentiles_{name}_ms"):
            assert ours[f"{name}_s"][f"p{int(p)}"] * 1000 == pytest.approx(value)
