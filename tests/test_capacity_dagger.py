"""The residual capacity controller (agents/experiments/capacity_dagger.py): untrained it plays the rule exactly (its
every decision and its day's reward), training moves it toward the teacher's labels, and capacity_learned's
dagger keys refuse bad input in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from pdgym.agents.experiments.capacity_dagger import ResidualPolicy, dagger, play_days
from pdgym.agents.experiments.capacity_learned import check_block
from pdgym.agents.experiments.capacity_room import play
from pdgym.baselines.capacity_hindsight import TrueFutureMPC
from pdgym.baselines.capacity_rules import CAPACITY_RULES
from pdgym.envs.capacity_control import CapacityControlEnv
from pdgym.envs.sim import ConfigError

SHORT = ("traffic.duration_s=600",)


@pytest.mark.parametrize("rule", ["heteroscale", "lend"])
def test_untrained_residual_policy_is_the_rule_exactly(rule):
    env = CapacityControlEnv("diurnal_bursts", SHORT, days=[0])
    policy = ResidualPolicy(env.observation_space.shape[0], prior=0.5)  # any prior > 0: the learned part is zero
    days, data = play_days(env, CAPACITY_RULES[rule](), [0], policy, teacher=CAPACITY_RULES[rule]())
    # every state: the policy's action (logged as the teacher's, the same rule) is the rule's
    acts = policy.logits(torch.as_tensor(data["obs"]), torch.as_tensor(data["rule"]),
                         torch.as_tensor(data["mask"])).argmax(-1).numpy()
    assert np.array_equal(acts, data["rule"]) and np.array_equal(data["label"], data["rule"])
    assert (data["rule"] != 0).sum() > 0  # the rule did act (not a trivially all-noop day)
    assert days[0]["reward"] == play(env.model, CAPACITY_RULES[rule](), 0)["reward"]


def test_dagger_rounds_fit_the_teacher_and_keep_the_best_training_round():
    env = CapacityControlEnv("diurnal_bursts", SHORT, days=[0, 1])
    torch.set_num_threads(1)
    policy, last, hist = dagger(env, CAPACITY_RULES["heteroscale"](), TrueFutureMPC(horizon=4), [0, 1], rounds=2,
                          epochs=5, lr=1e-3, hidden=16, prior=4.0, seed=0, log=lambda s: None)
    assert [h["round"] for h in hist] == [0, 1, 2]
    assert hist[2]["states"] > hist[1]["states"] > hist[0]["states"] > 0  # DAgger aggregates the visited states
    assert all(0.0 <= h["label_accuracy"] <= 1.0 for h in hist[1:])
    kept, _ = play_days(env, CAPACITY_RULES["heteroscale"](), [0, 1], policy)
    assert np.mean([s["reward"] for s in kept]) == pytest.approx(max(h["train_reward"] for h in hist))
    final, _ = play_days(env, CAPACITY_RULES["heteroscale"](), [0, 1], last)
    assert np.mean([s["reward"] for s in final]) == pytest.approx(hist[-1]["train_reward"])


GOOD = {"method": "dagger", "reference": {"name": "heteroscale"},
        "dagger": {"teacher": "mpc_true", "mpc_horizon": 12, "rounds": 6, "epochs": 20, "lr": 0.001, "hidden": 64,
                   "prior": 4.0}}


@pytest.mark.parametrize("path,value,key", [
    ("method", "bc", "repro.method"), ("dagger.teacher", "oracle", "repro.dagger.teacher"),
    ("dagger.rounds", 0, "repro.dagger.rounds"), ("dagger.lr", -1.0, "repro.dagger.lr"),
    ("dagger.prior", "abc", "repro.dagger.prior"), ("reference.name", "nope", "repro.reference.name")])
def test_bad_dagger_keys_refused_in_one_line(path, value, key):
    block = OmegaConf.create(GOOD)
    check_block(block)
    OmegaConf.update(block, path, value)
    with pytest.raises(ConfigError, match=rf"^{key}: got .*(allowed|must)"):
        check_block(block)


def test_forecast_mpc_plans_on_the_calendar_not_the_true_future():
    from pdgym.baselines.capacity_hindsight import ForecastMPC
    from pdgym.envs.capacity_control import capacity_model
    from pdgym.envs.sim.capacity import CapacityRun

    model = capacity_model("diurnal_bursts", SHORT)
    run = CapacityRun(model, 0)
    mpc = ForecastMPC(horizon=4)
    tr, dt = model.cfg.traffic, model.cfg.substep_s
    t = (np.arange(4 * model.substeps) + 0.5) * dt  # before any interval: the board's mean rate on the calendar
    cal = tr.base_rps * (1 + tr.diurnal_amp * np.sin(2 * np.pi * (t / tr.duration_s - tr.diurnal_phase)))
    f0 = mpc.future(run)
    assert np.allclose(f0.sum(1), cal * dt) and np.allclose(f0[:, 1] / f0.sum(1), tr.mix)
    for _ in range(3):
        run.apply(0)
        run.advance()
    before = mpc.future(run)
    run.traffic.arrivals[run.k:] = 0.0  # what is still to come: invisible to it
    run.traffic.rate[run.k:] = 0.0
    assert np.array_equal(mpc.future(run), before) and before.sum() > 0
