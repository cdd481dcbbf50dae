"""The elastic P/D capacity decision point (envs/sim/capacity.py, envs/capacity_control.py, baselines/capacity_*):
no request lost, the budget and the masks kept, masked actions and bad input refused in one line, the DP hindsight
optimal over its own model, and the env's Gymnasium contract."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pdgym.envs  # noqa: F401  (registers the ids)
import pytest
from gymnasium.utils.env_checker import check_env
from pdgym.baselines.capacity_hindsight import DPHindsight, path_value, plan, transition_costs, window_table
from pdgym.baselines.capacity_rules import CAPACITY_RULES
from pdgym.envs.capacity_control import capacity_model, load_board
from pdgym.envs.sim import ConfigError
from pdgym.envs.sim.capacity import ACTIONS, DOWN_D, FLIP_DP, CapacityRun
from pdgym.envs.sim.capacity_traffic import CAPACITY_SEEDS

SHORT = ("traffic.duration_s=900",)  # a quarter-hour day: the invariants do not need the whole hour


def random_day(model, seed: int, steps_rng: int):
    """A day under random masked actions; yields the run after every interval."""
    rng = np.random.default_rng(steps_rng)
    run = CapacityRun(model, seed)
    while not run.done:
        run.apply(int(rng.choice(np.flatnonzero(run.mask()))))
        run.advance()
        yield run


@pytest.mark.parametrize("board", ["diurnal_bursts", "mix_shift"])
def test_no_request_lost_across_flips_scale_downs_and_faults(board):
    model = capacity_model(board, SHORT + ("fail_per_h=40",))
    for run in random_day(model, 3, 0):
        t = run.fluid.totals
        arrived = t.arrived.sum()
        assert abs(arrived - (t.finished.sum() + t.rejected.sum() + run.fluid.in_system().sum())) <= 1e-9 * arrived
        assert (run.fluid.in_system() >= -1e-9).all()
    assert run.faults > 0  # the faults did happen
    assert run.fluid.in_system().sum() == 0.0  # after the day: finished + rejected = arrivals
    assert math.isclose(run.summary()["finished"] + run.summary()["rejected"], run.summary()["arrived"],
                        rel_tol=1e-12)


def test_budget_and_roles_kept_under_random_masked_actions():
    model = capacity_model("diurnal_bursts", SHORT)
    for run in random_day(model, 1, 7):
        assert run.gpus() <= model.cfg.gpu_budget
        assert run.count("P") >= 1 and run.count("D") >= 1  # no fault here: a role is never left empty


def test_masked_action_refused_in_one_line():
    run = CapacityRun(capacity_model("diurnal_bursts", SHORT), 0)
    while run.count("D") > 1:
        run.apply(DOWN_D)
        run.advance()
    assert not run.mask()[FLIP_DP]
    with pytest.raises(ConfigError) as e:
        run.apply(FLIP_DP)
    assert "\n" not in str(e.value) and str(e.value).startswith("action: flip_d_to_p is masked")
    with pytest.raises(ConfigError, match="^action: got 9"):
        run.apply(9)


@pytest.mark.parametrize("override,key", [
    ("interval_s=0", "capacity.interval_s"), ("interval_s=.nan", "capacity.interval_s"),
    ("startup_s=-1", "capacity.startup_s"), ("host_to_hbm_gbps=-5", "capacity.host_to_hbm_gbps"),
    ("traffic.base_rps=-3", "capacity.traffic.base_rps"), ("traffic.diurnal_amp=1.5", "capacity.traffic.diurnal_amp"),
    ("substep_s=4", "capacity.substep_s"), ("nonsense=1", "capacity.nonsense")])
def test_bad_board_values_one_line(override, key):
    with pytest.raises(ConfigError) as e:
        load_board("diurnal_bursts", [override])
    assert str(e.value).startswith(f"{key}:") and "\n" not in str(e.value)


def test_budget_below_one_of_each_refused():
    with pytest.raises(ConfigError, match=r"^capacity.gpu_budget: .*one prefill plus one decode"):
        capacity_model("diurnal_bursts", ("gpu_budget=1",))


def test_dp_is_optimal_over_its_own_model():
    """The DP's value is at least every static configuration's and every random feasible path's, in its model."""
    model = capacity_model("mix_shift", SHORT)
    configs = model.configs()
    tr = model.traffic(2)
    table = window_table(model, tr.arrivals, configs)
    cost = transition_costs(model, configs)
    start = int(np.flatnonzero((configs[:, 0] == 2) & (configs[:, 1] == 2))[0])
    path, value = plan(table, cost, start)
    assert math.isclose(path_value(table, cost, start, path), value, rel_tol=1e-9)
    for g in range(len(configs)):  # static: reach g by a shortest walk first, then hold (a feasible path)
        walk = [start]
        while walk[-1] != g:
            nxt = [b for b in np.flatnonzero(np.isfinite(cost[walk[-1]]))
                   if abs(configs[b] - configs[g]).sum() < abs(configs[walk[-1]] - configs[g]).sum()]
            walk.append(int(nxt[0]))
        static = (walk[1:] + [g] * table.shape[0])[:table.shape[0]]
        assert path_value(table, cost, start, static) <= value + 1e-6
    rng = np.random.default_rng(0)
    for _ in range(30):
        g, p = start, []
        for _w in range(table.shape[0]):
            g = int(rng.choice(np.flatnonzero(np.isfinite(cost[g]))))
            p.append(g)
        assert path_value(table, cost, start, p) <= value + 1e-6


def test_hindsight_beats_the_rules_on_a_training_day():
    """In the real episode (not the DP's model) the clairvoyant plan earns more than every untuned rule: the
    effect the boards measure, in direction."""
    model = capacity_model("diurnal_bursts", SHORT)

    def play(pol):
        run = CapacityRun(model, CAPACITY_SEEDS["train"][0])
        pol.reset(run)
        while not run.done:
            run.apply(pol.act(run))
            run.advance()
        return run.summary()["reward"]

    dp = play(DPHindsight())
    for name, cls in CAPACITY_RULES.items():
        assert dp > play(cls()), name


def test_env_contract():
    env = gym.make("pdgym/CapacityControl-v0", overrides=list(SHORT))
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=5)
    assert info["day"] in CAPACITY_SEEDS["train"] and env.observation_space.contains(obs)
    mask = env.unwrapped.action_masks()
    assert mask.shape == (len(ACTIONS),) and mask[0]
    done, n = False, 0
    while not done:
        obs, r, term, trunc, info = env.step(0)
        done, n = term or trunc, n + 1
    assert n == 60 and "summary" in info  # 900 s / 15 s
    with pytest.raises(ConfigError, match="^days:"):
        gym.make("pdgym/CapacityControl-v0", days="val")
