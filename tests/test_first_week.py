"""First-week details (issue 27, item 9), each checked against what the simulator did or what a user sees:
pdgym-enjoy says the action taken at each decision, the Python API's errors name the key and what is allowed,
gym.make's defaults do not warn about themselves, pdgym's warnings are one line, a board plot says when an
axis is the same for every policy, and a profile table measured for another model or hardware is refused."""

from __future__ import annotations

import dataclasses
import re

import gymnasium as gym
import numpy as np
import pdgym.envs  # noqa: F401 - registers the envs
import pytest

ROUTE = re.compile(r"route req (\d+) .*-> (?:worker (\d+)|prefill (\d+) unit (\d+))")
SMALL = ["workload.num_requests=40"]


def _play(env, pick, steps: int = 40) -> list[tuple[str, int | None, tuple]]:
    """(description, request it names, where the request went after the step) for `steps` decisions."""
    u = env.unwrapped
    env.reset(seed=0)
    out = []
    for _ in range(steps):
        mask = np.asarray(u.action_masks(), dtype=bool)
        a = pick(u, mask)
        text = u.describe_action(a, mask)
        m = ROUTE.search(text)
        rid = int(m.group(1)) if m else None
        _, _, term, trunc, _ = env.step(a)
        req = u.sim.req
        where = (int(req.worker[rid]),) if m and m.group(2) else (int(req.prefill_inst[rid]), int(req.prefill_dp[rid])) \
            if m else ()
        out.append((text, m, where))
        if term or trunc:
            break
    return out


def _last_allowed(u, mask):
    return int(np.flatnonzero(mask)[-1])


def _first_allowed(u, mask):
    return int(np.flatnonzero(mask)[0])


@pytest.mark.parametrize("kwargs", [{}, {"action": "pick"}])
def test_decode_decisions_name_the_request_and_the_worker_it_went_to(kwargs):
    env = gym.make("pdgym/DecodeRouting-v0", scenario="decode_tier_n8", overrides=SMALL, **kwargs)
    seen = _play(env, _first_allowed)
    routed = [(m, where) for _, m, where in seen if m]
    assert routed, [t for t, _, _ in seen]
    for m, where in routed:  # the worker the line names is the worker the simulator admitted the request to
        assert where == (int(m.group(2)),)


def test_decode_skip_and_end_are_said_in_words():
    env = gym.make("pdgym/DecodeRouting-v0", scenario="decode_tier_n8", overrides=SMALL)
    u = env.unwrapped
    env.reset(seed=0)
    core = u.core
    assert u.describe_action(core.end).startswith("route req ")  # END is masked (nothing runs): the default, said so
    assert "(invalid action 8: the default instead)" in u.describe_action(core.end)
    while not u.action_masks()[core.end + 1]:
        env.step(_first_allowed(u, u.action_masks()))
    assert u.describe_action(core.end + 1).startswith(f"SKIP req {core.head} ")
    assert u.describe_action(core.end).startswith("END (no more admissions to decode 0")


@pytest.mark.parametrize("mode", ["allocation", "route"])
def test_prefill_decisions_name_the_request_and_the_unit_it_went_to(mode):
    kw = {"scenario": "prefix_single"} if mode == "route" else {}
    env = gym.make("pdgym/PrefillDispatch-v0", mode=mode, overrides=SMALL, **kw)
    seen = _play(env, _last_allowed if mode == "route" else
                 (lambda u, mask: int(np.flatnonzero(mask[1:-1])[0]) + 1 if mask[1:-1].any() else 0))
    routed = [(m, where) for _, m, where in seen if m]
    assert routed, [t for t, _, _ in seen]
    for m, where in routed:
        assert where == (int(m.group(3)), int(m.group(4)))


def test_prefill_timing_and_composition_say_what_is_released():
    env = gym.make("pdgym/PrefillDispatch-v0", overrides=SMALL)
    u = env.unwrapped
    env.reset(seed=0)
    reqs = f"{len(u.sim.buffer)} request" + ("s" if len(u.sim.buffer) != 1 else "")
    assert u.describe_action(0) == f"hold ({reqs} buffered)"
    assert u.describe_action(1) == f"release the buffer ({reqs}) -> prefill 0"
    env = gym.make("pdgym/PrefillDispatch-v0", mode="composition", overrides=SMALL)
    u = env.unwrapped
    env.reset(seed=0)
    work, med = u.sim.req.work, u.core.classes.median
    short = sum(int(work[r] <= med) for r in u.sim.buffer)
    mask = u.action_masks()
    if mask[1]:
        assert f"short half (<= {med:.0f} tok: {short} of {len(u.sim.buffer)} requests)" in u.describe_action(1)
    assert u.describe_action(0).startswith(f"release the whole buffer ({len(u.sim.buffer)} request")


@pytest.mark.parametrize("kwargs,expect", [({"mode": "phase"}, r"colocated 0 unit \d+: run a (prefill|decode|mixed) batch"),
                                           ({"mode": "threshold"}, r"colocated 0 unit \d+: EB, theta = 0\.\d+"),
                                           ({"mode": "threshold", "continuous": True, "choose_mode": True},
                                            r"colocated 0 unit \d+: (EB|MB for the cycle), theta = 0\.\d+")])
def test_batching_decisions_name_the_unit_and_the_batch(kwargs, expect):
    env = gym.make("pdgym/PhaseBatching-v0", overrides=["workload.num_requests=20", "workload.concurrency=8"], **kwargs)
    u = env.unwrapped
    env.reset(seed=0)
    a = u.default_action()
    text = u.describe_action(a)
    assert re.fullmatch(expect, text), text
    if not kwargs.get("continuous"):
        assert str(u._unit) in text


# --------------------------------------------------------------------------- (b) the Python API's errors
def _error(fn) -> str:
    from pdgym.envs.sim import ConfigError

    with pytest.raises(ConfigError) as exc:
        fn()
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_gym_make_names_an_unknown_override_key_and_lists_the_keys_next_to_it():
    from pdgym.envs.sim.config import WorkloadConfig

    msg = _error(lambda: gym.make("pdgym/DecodeRouting-v0", overrides=["workload.bad_key=1"]))
    assert msg.startswith("overrides: workload.bad_key: unknown key; workload has: ")
    listed = set(msg.split("workload has: ")[1].split(";")[0].split(", "))
    assert {"num_requests", "rate", "trace"} <= listed <= {f.name for f in dataclasses.fields(WorkloadConfig)}
    msg = _error(lambda: gym.make("pdgym/DecodeRouting-v0", overrides=["bad.key=1"]))
    assert msg.startswith("overrides: bad: unknown key; the config has: ") and "workload" in msg and "cluster" in msg
    assert "did you mean workload.rate?" in _error(lambda: gym.make("pdgym/PhaseBatching-v0", overrides=["workload.rat=3"]))
    assert _error(lambda: load_scenario_("decode_tier_n8", "workload.rate=3")).startswith(
        "overrides: got 'workload.rate=3'; must be a list of 'key=value' strings")


def load_scenario_(*args):
    from pdgym.envs.scenario import load_scenario

    return load_scenario(*args)


def test_simulate_says_policies_is_a_mapping_with_an_example():
    from pdgym.baselines import make_policies, make_policy
    from pdgym.envs.sim import simulate

    sc = load_scenario_("decode_tier_n8", ["workload.num_requests=20"])
    msg = _error(lambda: simulate(sc.sim, "least_kv"))
    assert msg.startswith("policies: got 'least_kv' (str); must be a mapping decision point (prefill, decode, batching)")
    assert "{'decode': make_policy('decode', 'least_kv')}" in msg
    assert "make_policy('decode', 'least_kv')" in _error(lambda: simulate(sc.sim, {"decode": "least_kv"}))
    assert "{'decode': 'least_kv'}" in _error(lambda: make_policies("least_kv"))
    assert ".sim" in _error(lambda: simulate(sc, None))  # the Scenario, not its simulator config
    # the example in the messages runs
    assert simulate(sc.sim, {"decode": make_policy("decode", "least_kv")}).summary()["finished"] == 20


def test_evaluate_entry_points_name_what_they_take():
    from pdgym.agents.evaluation import candidates
    from pdgym.agents.evaluation.runner import evaluate

    assert _error(lambda: candidates.resolve(3)).startswith("policy: got 3; must be a baseline name")
    sc = load_scenario_("decode_tier_n8", ["workload.num_requests=20"])
    cand = candidates.resolve("least_kv")
    assert _error(lambda: evaluate(sc.raw, cand, 3)).startswith("seeds: got 3; must be a non-empty list")
    assert "load_scenario('decode_tier_n16').raw" in _error(lambda: evaluate(sc.sim, cand, [0]))


# --------------------------------------------------------------------------- (c) gym.make's own defaults
def test_gym_make_defaults_give_varied_episodes_without_a_warning_and_a_user_value_still_warns():
    import warnings

    import yaml
    from pdgym.envs.base import EPISODE_REQUESTS
    from pdgym.envs.sim.notices import EnvWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        env = gym.make("pdgym/DecodeRouting-v0")
    u = env.unwrapped
    lo, hi, n = u.window.rows
    assert n == min(EPISODE_REQUESTS, u.sim_config.workload.num_requests) < hi - lo
    offsets = {u.window.config(u.sim_config, np.random.default_rng(s)).workload.trace_offset for s in range(4)}
    assert len(offsets) > 1  # seeds replay different rows
    with pytest.warns(EnvWarning, match=r"workload.num_requests=10000 fills the train split of 'azure_conv'"):
        gym.make("pdgym/DecodeRouting-v0", overrides=["workload.num_requests=10000"])
    with pytest.warns(EnvWarning, match="fills the train split"):
        gym.make("pdgym/DecodeRouting-v0", config={"workload": {"num_requests": 9000}})
    for name in ("decode_routing", "prefill_dispatch", "phase_batching"):  # the training episode is the same default
        from importlib.resources import files

        conf = yaml.safe_load((files("pdgym.conf") / "env" / f"{name}.yaml").read_text())
        assert f"workload.num_requests={EPISODE_REQUESTS}" in conf["env"]["overrides"]


# --------------------------------------------------------------------------- (d) one-line warnings
def test_pdgym_warnings_print_as_one_line_and_others_keep_their_format():
    import subprocess
    import sys

    code = ("import warnings, gymnasium as gym, pdgym.envs\n"
            "gym.make('pdgym/DecodeRouting-v0', scenario='decode_tier_n8', trace_split=None,\n"
            "         overrides=['workload.num_requests=99999', 'workload.trace_offset=10000']).reset(seed=0)\n"
            "gym.make('pdgym/DecodeRouting-v0', overrides=['workload.num_requests=10000'])\n"
            "warnings.warn('not ours', FutureWarning)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    lines = p.stderr.splitlines()
    ours = [ln for ln in lines if ln.startswith("pdgym: ")]
    assert [ln.split(":")[1].strip() for ln in ours] == ["WorkloadWarning", "EnvWarning"], p.stderr
    assert "workload.num_requests: trace 'azure_conv' has only" in ours[0]
    rest = [ln for ln in lines if not ln.startswith("pdgym: ")]
    assert rest == ["<string>:5: FutureWarning: not ours"], p.stderr  # Python's own format (file:line: Category)


# --------------------------------------------------------------------------- (e) a board axis the same for every policy
def _drawn(monkeypatch, draw) -> dict:
    """What a leaderboard plot put on its figure: every text shown and the axis labels."""
    import matplotlib.text
    from matplotlib.figure import Figure

    seen: dict = {}
    save = Figure.savefig

    def record(fig, *args, **kwargs):
        ax = fig.axes[0]
        seen.update(texts=[t.get_text() for t in fig.findobj(matplotlib.text.Text)], x=ax.get_xlabel(),
                    y=ax.get_ylabel(), axis=ax.axison)
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    draw()
    return seen


def test_tradeoff_plot_says_a_metric_is_the_same_for_every_policy_instead_of_drawing_its_axis(monkeypatch, tmp_path):
    import pandas as pd
    from pdgym.agents.evaluation.leaderboard_plots import bars, tradeoff

    ttft = [0.2168, 0.2150, 0.2185]  # per seed, the same for every router (decode routing leaves prefill alone)
    tpot = {"least_kv": 0.112, "br0": 0.068, "jsq": 0.116}
    runs = pd.DataFrame([{"policy": p, "kind": "baseline", "seed": s, "ttft_mean": ttft[s], "tpot_mean": m + 0.001 * s}
                         for p, m in tpot.items() for s in range(3)])
    seen = _drawn(monkeypatch, lambda: tradeoff(runs, "decode_ht_n16", tmp_path / "a.png"))
    assert seen["x"].endswith(f"ttft_mean = {np.mean(ttft):.4g} s for every policy")  # under the axis: hides no point
    assert "TTFT" not in seen["y"] and seen["x"].startswith("TPOT mean")
    assert {"least_kv", "br0", "jsq"} <= set(seen["texts"])  # a row per policy
    moved = runs.assign(ttft_mean=runs.ttft_mean + np.where(runs.policy == "br0", 0.01, 0.0))
    seen = _drawn(monkeypatch, lambda: tradeoff(moved, "decode_ht_n16", tmp_path / "b.png"))
    assert seen["y"] == "TTFT mean (s)" and not any("for every policy" in t for t in seen["texts"])
    table = pd.DataFrame([{"policy": p, "kind": "baseline", "mean": 3.5, "ci_low": 3.4, "ci_high": 3.6} for p in tpot])
    seen = _drawn(monkeypatch, lambda: bars(table, "rps (req/s), higher is better", "batching", tmp_path / "c.png"))
    assert not seen["axis"] and any(t.startswith("rps (req/s) = 3.5 for every policy") for t in seen["texts"])


# --------------------------------------------------------------------------- (f) a profile table of another model or hardware
def _table(path, model: str | None, hardware: str | None):
    rows = [("prefill", 128, "", 0.01), ("prefill", 4096, "", 0.2), ("decode", 8, 1000, 0.005), ("decode", 64, 90000, 0.02)]
    head = "phase,tokens,kv,time_s" + (",model" if model else "") + (",hardware" if hardware else "")
    tail = (f",{model}" if model else "") + (f",{hardware}" if hardware else "")
    path.write_text(head + "\n" + "".join(f"{p},{t},{k},{s}{tail}\n" for p, t, k, s in rows))
    return str(path)


def _table_cost(path: str, hardware: str, model: str):
    from pdgym.envs.sim.config import CostConfig, InstanceConfig
    from pdgym.envs.sim.cost import build_cost_model
    from pdgym.envs.sim.hardware import load_hardware
    from pdgym.envs.sim.models import load_model

    return build_cost_model(CostConfig(kind="table", params={"path": path}), load_hardware(hardware), load_model(model),
                            InstanceConfig(count=1))


def test_a_profile_table_of_another_model_is_refused_and_of_other_hardware_warned(tmp_path):
    import warnings

    from pdgym.envs.sim.notices import CostWarning

    path = _table(tmp_path / "t.csv", "qwen3_8b", "h100")
    msg = _error(lambda: _table_cost(path, "h100", "qwen3_30b_a3b"))
    assert msg.startswith(f"cost.params.path: {path} times model qwen3_8b; the scenario serves qwen3_30b_a3b")
    with pytest.warns(CostWarning, match=r"timed on hardware h100; the scenario runs h800"):
        _table_cost(path, "h800", "qwen3_8b")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = _table_cost(path, "h100", "qwen3_8b")  # the pair it timed: no word
        bare = _table_cost(_table(tmp_path / "bare.csv", None, None), "h800", "qwen3_30b_a3b")  # names nothing: taken
    one, z = np.ones(1), np.zeros(1)
    assert same.pass_time(one * 128, one * 128 * 64, z, z) == pytest.approx(0.01)
    assert bare.pass_time(z, z, one * 64, one * 90000) == pytest.approx(0.02)


def test_pdgym_sim_refuses_another_models_table_in_one_line(tmp_path):
    import subprocess
    import sys

    from pdgym.envs.sim.shell import app_command  # the hint names the executable as this shell runs it

    path = _table(tmp_path / "t.csv", "qwen3_8b", "h100")
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "pdgym.agents.apps.sim", "scenario=decode_tier_n8", "workload.num_requests=20",
                        "cost.kind=table", f"+cost.params.path={path}", f"hydra.run.dir={out}"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"pdgym-sim: error: cost.params.path: {path} times model qwen3_8b; the scenario serves qwen3_30b_a3b: profile it "
        f"({app_command('pdgym-profile')} model=qwen3_30b_a3b hardware=...) or use a scenario of qwen3_8b"], p.stderr
    assert not out.exists()


def test_leaderboard_entry_points_name_what_they_take():
    from pdgym.agents.apps import leaderboard as L
    from pdgym.agents.evaluation.leaderboard_run import board_scenarios

    assert _error(lambda: L.check_config("quick")).startswith("config: got str; must be the composed leaderboard config")
    assert _error(lambda: board_scenarios(["decode"])).startswith("scenarios: got ['decode']; must be a mapping")
    msg = _error(lambda: board_scenarios({"d": "decode_tier_n8"}))
    assert msg.startswith("scenarios.d: got 'decode_tier_n8'; must be a mapping with keys scenario, point, primary")


# --------------------------------------------------------------------------- issue 37's smaller items
def _app(*args: str, cwd):
    import os
    import subprocess
    import sys
    from pathlib import Path

    return subprocess.run([str(Path(sys.executable).parent / args[0]), *args[1:]], capture_output=True, text=True,
                          cwd=cwd, timeout=300, check=False, env=dict(os.environ, WANDB_MODE="disabled"))


def test_bars_are_off_and_tables_whole_when_the_output_is_not_a_terminal(tmp_path):
    # progress=true is pdgym-eval's default; captured output is no terminal: no carriage-return redraws
    r = _app("pdgym-eval", "policy=least_kv", "scenario=decode_tier_n8", "workload.num_requests=60", "seeds=[0]",
             "hydra.run.dir=ev", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "\r" not in r.stderr and "\r" not in r.stdout
    sets = ", ".join(f"{{label: set_{i}, decode: {n}}}" for i, n in enumerate(["least_kv", "br0", "jsq", "random",
                                                                               "power_of_two", "round_robin"]))
    r = _app("pdgym-sim", "scenario=decode_tier_n8", "workload.num_requests=60", "plots=false", f"compare=[{sets}]",
             "hydra.run.dir=sim", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "\r" not in r.stderr and "…" not in r.stdout  # no column cut to rich's 80 when piped
    assert all(f"set_{i}" in r.stdout for i in range(6))


def test_a_board_off_a_terminal_says_each_scenario_as_it_ends(tmp_path):
    # the bar is off in a log; without these lines `make run` printed nothing for minutes
    r = _app("pdgym-leaderboard", "preset=demo", "progress=true", "plots=false", f"out_dir={tmp_path / 'b'}",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("leaderboard: ") and " done (" in ln]
    assert [ln.split()[1] for ln in lines] == ["prefill_ds_v3_h800", "decode_ht_n16"]
    assert lines[-1].split("(")[1].startswith("16/16 runs") and "\r" not in r.stderr + r.stdout


@pytest.mark.parametrize("args, hint", [
    (["pdgym-sim", "workload.rat=3"], "workload.rat: unknown key; did you mean 'rate'?"),
    (["pdgym-sim", "scenario=decode_tier_n17"], "did you mean 'decode_tier_n16'?"),
    (["pdgym-eval", "policy=least_kvv"], "did you mean 'least_kv'?"),
    (["pdgym-sim", "seeed=3"], "seeed: unknown key; did you mean seed?"),
    # a mistyped config group is the group, not the scenario_name key that looks alike
    (["pdgym-sim", "scenaro=decode_tier_n8"], "did you mean scenario=decode_tier_n8 (a config group)?"),
])
def test_a_mistyped_key_or_name_on_the_command_line_gets_did_you_mean(tmp_path, args, hint):
    r = _app(*args, "hydra.run.dir=out", cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and hint in lines[0], r.stderr[-1000:]
