"""bench/bench_scale.py's two variants scale what they say: fixed requests against a k-fold cluster and rate, or
(steady) requests k-fold too, so each instance sees the same traffic for the same simulated time."""

from __future__ import annotations

from bench import bench_scale  # the repository root is on sys.path under `python -m pytest` (make test)


def test_scaled_configs_multiply_instances_rate_and_only_steady_requests():
    base, fixed, steady = bench_scale.scaled(1, 50), bench_scale.scaled(4, 50), bench_scale.scaled(4, 50, steady=True)
    for cfg in (fixed, steady):
        for tier in ("prefill", "decode"):
            assert cfg["cluster"][tier]["count"] == 4 * base["cluster"][tier]["count"]
        assert cfg["workload"]["rate"] == 4 * base["workload"]["rate"]
    assert fixed["workload"]["num_requests"] == 50 and steady["workload"]["num_requests"] == 200
    assert fixed["workload"]["trace"] == base["workload"]["trace"]
    assert "trace" not in steady["workload"] and steady["workload"]["arrival"] == "poisson"


def test_steady_variant_keeps_the_traffic_per_instance():
    """Twice the cluster at twice the requests: the same instances per request and about the same decode batches
    (the same load per instance); the fixed variant at twice the cluster halves each instance's share."""
    one, two = (bench_scale.measure(k, 150, 1, steady=True) for k in (1, 2))
    assert (one["instances"], one["requests"], two["instances"], two["requests"]) == (4, 150, 8, 300)
    assert 0.7 < two["tokens_per_decode_step"] / one["tokens_per_decode_step"] < 1.4
    small, fixed = (bench_scale.measure(k, 150, 1) for k in (1, 2))  # the same 150 requests, half as many an instance
    assert fixed["requests"] == small["requests"] == 150
    assert fixed["tokens_per_decode_step"] < 0.75 * small["tokens_per_decode_step"]  # smaller batches, more steps
    assert fixed["events_per_request"] > 1.2 * small["events_per_request"]
    for r in (one, two, small, fixed):
        assert r["us_per_request"] > 0 and r["events_per_request"] >= 2  # an arrival and a decode end at least
