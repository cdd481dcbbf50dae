"""The prefix-block KV cache: exact against independent replays, bounded, and its bad input one line.

`prefix_single` (one prefill unit, requests 30 s apart, so each prefill completes before the next
dispatch) must give exactly the hit ratio of a sequential replay of the trace's block hashes written
here from the definition (hit = min(512 x longest cached prefix, prompt - 1)), unbounded and under a
finite LRU; no hit ever reaches the whole prompt.
"""

from __future__ import annotations

import importlib
import json
import os
from collections import OrderedDict

import numpy as np
import pytest
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import simulate
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.engine import Simulator
from pdgym.envs.sim.traces import read_trace

ROWS = 200


def _rows(n: int | None = None) -> list[tuple[int, list[int]]]:
    """(prompt, hash_ids) of the first n (ROWS) Mooncake rows, read with json, not with pdgym's reader."""
    n = n or ROWS
    path = read_trace("mooncake_conv").name
    out = []
    with open(path) as fh:
        for line in fh:
            row = json.loads(line)
            out.append((row["input_length"], row["hash_ids"]))
            if len(out) == n:
                break
    return out


def _replay(capacity_blocks: int | None) -> float:
    """Token hit ratio of an independent in-order replay through one LRU of blocks (None: unbounded)."""
    cache: OrderedDict[int, None] = OrderedDict()
    hit = total = 0
    for prompt, chain in _rows():
        m = 0
        while m < len(chain) and chain[m] in cache:
            m += 1
        hit += min(512 * m, prompt - 1)
        total += prompt
        for b in reversed(chain):  # deepest first: a chain's root stays the most recent of it
            cache[b] = None
            cache.move_to_end(b)
            while capacity_blocks is not None and len(cache) > capacity_blocks:
                cache.popitem(last=False)
    return hit / total


def _run(*overrides: str, seed: int = 0, rows: int = ROWS):
    sc = load_scenario("prefix_single", [f"workload.num_requests={rows}", *overrides])
    return simulate(sc.sim, {}, seed=seed)


@pytest.fixture(scope="module")
def unbounded():
    return _run()


def test_unbounded_hit_ratio_equals_a_sequential_replay(unbounded):
    got = unbounded.summary()
    assert got["prefix_hit_ratio"] == pytest.approx(_replay(None), rel=0, abs=1e-12)
    assert got["prefix_hit_ratio"] > 0.05  # the first 200 rows share their system prompt and earlier turns
    assert got["recomputed_tokens"] == 0 and got["cache_evictions"] == 0
    r = unbounded.requests
    assert (r.cached <= r.prompt - 1).all()
    # a hit removes its tokens from the passes' compute: the passes carried exactly the uncached prompt tokens
    assert unbounded.steps[unbounded.steps.kind == 0].tokens.sum() == (r.prompt - r.cached).sum() > 0
    assert (r.first_token.to_numpy()[:-1] < r.dispatch.to_numpy()[1:]).all(), "prefills overlapped: not sequential"


def test_finite_lru_equals_an_independent_lru_replay():
    cap = 600  # blocks: longer than any chain here, so in-flight locks never bind
    res = _run(f"cluster.prefill.cache_tokens={cap * 512}")
    got = res.summary()
    assert got["cache_evictions"] > 0
    assert got["prefix_hit_ratio"] == pytest.approx(_replay(cap), rel=0, abs=1e-12)
    assert got["prefix_hit_ratio"] < _replay(None)
    assert got["recomputed_tokens"] > 0


# 30 conversations of short turns on one unit, a working set (~300 blocks) over its cache (60 blocks)
CHAT = ["workload.num_requests=600", "workload.rate=1", "workload.trace=null", "workload.arrival=deterministic",
        "workload.prompt.dist=fixed", "workload.prompt.mean=600", "workload.output.dist=fixed",
        "workload.output.mean=20", "workload.chat.sessions=30", "workload.chat.system_tokens=1024",
        "workload.chat.max_context=8192"]


def _chat(*overrides: str):
    return simulate(load_scenario("prefix_single", [*CHAT, *overrides]).sim, {}, seed=2).summary()


def test_eviction_rule_matters_and_hindsight_leads():
    """Belady (evict the block reused furthest ahead) keeps more hits than LRU and FIFO at one capacity."""
    ratio = {ev: _chat("cluster.prefill.cache_tokens=30720", f"cluster.prefill.cache_eviction={ev}")["prefix_hit_ratio"]
             for ev in ("lru", "fifo", "belady")}
    unbounded = _chat()["prefix_hit_ratio"]
    assert unbounded > ratio["belady"] > max(ratio["lru"], ratio["fifo"]), (ratio, unbounded)


def test_host_tier_recovers_evicted_hits_at_a_transfer_cost():
    small = "cluster.prefill.cache_tokens=30720"
    base = _chat(small)
    fast = _chat(small, "cluster.prefill.host_cache_tokens=100000000")
    slow = _chat(small, "cluster.prefill.host_cache_tokens=100000000", "cluster.prefill.host_cache_gbps=2")
    assert fast["prefix_hit_ratio"] > base["prefix_hit_ratio"]
    assert slow["prefix_hit_ratio"] == fast["prefix_hit_ratio"]  # prefills still one at a time: the same hits
    # a host hit of a few thousand tokens is ~0.5 GB of KV (128 KiB a token on Llama-3.1-8B): at 2 GB/s a
    # request waits for it, at 50 GB/s barely; the hits being equal, TTFT differs by the transfers alone
    assert slow["ttft_mean"] > fast["ttft_mean"] + 0.05


def test_default_capacity_is_hbm_after_weights_and_running_kv():
    sc = load_scenario("prefix_single", ["workload.num_requests=50", "cluster.prefill.cache_tokens=null"])
    sim = Simulator(sc.sim, {}, seed=0)
    longest = max(p for p, _ in _rows(50))
    # from the datasheets: H100 80 GB x mem_util 0.9, less 8.03 B BF16 weights, over 128 KiB of KV a token,
    # less the running KV (the longest prompt and one 8192-token chunk)
    want = (80e9 * 0.9 - 8.03e9 * 2) / 131072 - longest - 8192
    assert abs(sim.cache_capacity_tokens - want) <= 1


def test_no_block_data_means_no_cache():
    sc = load_scenario("ds_v3_h800_3p1d", ["workload.num_requests=50"])
    sim = Simulator(sc.sim, {}, seed=0)
    assert all(p.bcaches is None for p in sim.prefill)


def test_cache_memory_is_bounded_by_capacity():
    res_cap = 40 * 512
    sc = load_scenario("prefix_single", [f"workload.num_requests={ROWS}", f"cluster.prefill.cache_tokens={res_cap}"])
    sim = Simulator(sc.sim, {}, seed=0)
    sim.run()
    unit = sim.prefill[0].bcaches[0]
    assert len(unit.hbm) <= 40 and not unit.hbm.locks and not sim.prefill[0].locked


def test_synthetic_chat_sessions_share_their_history():
    base = ["workload.num_requests=400", "workload.rate=5", "workload.trace=null", "workload.arrival=poisson",
            "workload.prompt.dist=fixed", "workload.prompt.mean=300", "workload.output.dist=fixed",
            "workload.output.mean=20", "workload.chat.system_tokens=1024", "workload.chat.max_context=8192"]
    few = simulate(load_scenario("prefix_single", [*base, "workload.chat.sessions=4"]).sim, {}, seed=1).summary()
    many = simulate(load_scenario("prefix_single", [*base, "workload.chat.sessions=200"]).sim, {}, seed=1).summary()
    # few sessions: each turn re-reads its long conversation; many: mostly the shared system prompt
    assert few["prefix_hit_ratio"] > many["prefix_hit_ratio"] > 0.3


# --------------------------------------------------------------------------- bad input
GOOD = {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]}


def _jsonl(tmp_path, rows, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


@pytest.mark.parametrize("row, text", [
    ("{not json", "line 2: malformed JSON"),
    ({**GOOD, "hash_ids": [1, 2, 3]}, "line 2: field hash_ids has 3 blocks; input_length 1000 needs ceil(1000 / 512) = 2"),
    ({**GOOD, "hash_ids": [1, -2]}, "line 2: field hash_ids must be a list of integers"),
    ({**GOOD, "hash_ids": [1, 2.5]}, "line 2: field hash_ids must be a list of integers"),
    ({**GOOD, "input_length": 0, "hash_ids": []}, "line 2: field input_length is 0"),
    ({**GOOD, "output_length": 10**10}, "line 2: field output_length is 10000000000"),
    ({**GOOD, "timestamp": "soon"}, "line 2: field timestamp"),
    ({k: v for k, v in GOOD.items() if k != "hash_ids"}, "line 2: field hash_ids missing"),
])
def test_malformed_mooncake_line_is_named(tmp_path, row, text):
    p = _jsonl(tmp_path, [GOOD, row])
    with pytest.raises(ConfigError) as exc:
        read_trace(str(p))
    msg = str(exc.value)
    assert text in msg and str(p) in msg and "\n" not in msg, msg


def test_format_and_name_disagree(tmp_path):
    mooncake_as_csv = _jsonl(tmp_path, [GOOD], name="t.csv")
    with pytest.raises(ConfigError, match="named .csv but holds JSON lines"):
        read_trace(str(mooncake_as_csv))
    csv_as_jsonl = tmp_path / "a.jsonl"
    csv_as_jsonl.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n")
    with pytest.raises(ConfigError, match="named .jsonl but does not hold JSON lines"):
        read_trace(str(csv_as_jsonl))


@pytest.mark.parametrize("argv, key", [
    (["scenario=prefix_single", "cluster.prefill.cache_tokens=100"],
     "cluster.prefill.cache_tokens: 100 tokens is smaller than one block"),
    (["scenario=prefix_single", "cluster.prefill.cache_eviction=random"], "cluster.prefill.cache_eviction"),
    (["scenario=prefix_single", "cluster.prefill.host_cache_tokens=10"], "cluster.prefill.host_cache_tokens"),
    (["scenario=prefix_single", "cluster.prefill.host_cache_gbps=inf"], "cluster.prefill.host_cache_gbps"),
    (["scenario=prefix_single", "+cluster.decode.cache_tokens=4096"], "cluster.decode.cache_tokens"),
    (["workload.chat.sessions=-1"], "workload.chat.sessions"),
    (["workload.chat.sessions=4", "workload.prefix_groups=2"], "workload.chat.sessions"),
])
def test_bad_cache_settings_are_one_line_exit_2(argv, key, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main = importlib.import_module("pdgym.agents.apps.sim").main
    with pytest.raises(SystemExit) as exc:
        main([*argv, "workload.num_requests=20", f"hydra.run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exc.value.code == 2 and len(lines) == 1 and key in lines[0], err
    assert os.listdir(tmp_path) == []


def test_trace_size_is_checked_before_reading(tmp_path, monkeypatch):
    import pdgym.envs.sim.traces as T

    p = _jsonl(tmp_path, [GOOD] * 50)
    monkeypatch.setattr(T, "MAX_TRACE_BYTES", 100)
    with pytest.raises(ConfigError, match="more than the 100 bytes this reader accepts"):
        read_trace(str(p))
    assert np.isfinite(os.path.getsize(p))


def test_trace_counts_each_units_blocks_and_each_requests_hit():
    from pdgym.agents.trace import chrome_trace, simulate_traced

    cap = 40
    sc = load_scenario("prefix_single", ["workload.num_requests=40", f"cluster.prefill.cache_tokens={cap * 512}"])
    res, passes = simulate_traced(sc.sim, {}, seed=0)
    ev = chrome_trace(passes, res.requests)["traceEvents"]
    counts = [e["args"]["unit 0"] for e in ev if e.get("ph") == "C"]
    assert len(counts) == sum(p.kind == "prefill" for p in passes) and max(counts) == cap and counts[0] == 0
    hits = {e["id"]: e["args"]["prefix_hit"] for e in ev if e.get("ph") == "b" and e["name"].startswith("request ")}
    assert sum(hits.values()) == res.requests.cached.sum() > 0


def test_board_headroom_row_carries_its_own_scenario_overrides():
    from pdgym.agents.evaluation.leaderboard_run import board_scenarios

    entry = {"scenario": "prefix_mooncake", "point": "prefill", "primary": "ttft_mean",
             "headroom": [{"label": "hindsight", "name": "cache_ttft",
                           "overrides": ["cluster.prefill.cache_eviction=belady"]}]}
    (sc,) = board_scenarios({"prefix_mooncake": entry})
    assert sc.raw()["cluster"]["prefill"]["cache_eviction"] == "lru"
    assert sc.raw(None, ("cluster.prefill.cache_eviction=belady",))["cluster"]["prefill"]["cache_eviction"] == "belady"
    bad = {**entry, "headroom": [{"label": "h", "name": "cache_ttft", "overrides": "cluster.prefill.cache_eviction"}]}
    with pytest.raises(ConfigError, match="headroom.overrides"):
        board_scenarios({"prefix_mooncake": bad})
