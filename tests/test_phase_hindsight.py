"""The time-varying batching mix (coloc_rtx_pro_6000_qwen3_8b_shift_mix) and its hindsight row.

Mechanism behind the scenario: under an open loop EB's refill waits for about theta x (running requests)
arrivals (ALGORITHMS.md s5: fillable (N - k) >= n k), and the running batch grows with the mean output, so a
threshold's TTFT cost is several times larger in a conversation phase (mu_O ~ 211) than in a code phase
(mu_O ~ 28). PhaseHindsight: EB (or MB) per phase, switched at the phase's first arrival, oracle only.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from pdgym.baselines import make_policy
from pdgym.baselines.phase_hindsight import PhaseHindsight
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import ConfigError, SimResult, Simulator

SCN = "coloc_rtx_pro_6000_qwen3_8b_shift_mix"
SMALL = [f"workload.phases.{i}.num_requests={n}" for i, n in enumerate((300, 200, 300, 200))]


@pytest.fixture(scope="module")
def cfg():
    return load_scenario(SCN, SMALL).sim


def run(cfg, policy, seed=0):
    sim = Simulator(cfg, {"batching": policy}, seed)
    sim.run()
    return SimResult(sim).requests


def one_phase(cfg, i: int, n: int = 400):
    """Phase i of the mix alone (its lengths and rate): no carry-over from the phase before."""
    ph = dataclasses.replace(cfg.workload.phases[i], num_requests=n)
    return dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, phases=[ph]))


def test_theta_costs_ttft_in_proportion_to_the_output_length(cfg):
    """Raising EB's theta from 0.02 to 0.3 delays first tokens far more in a conversation phase (long outputs:
    a big running batch, so a refill waits for many arrivals) than in a code phase (short ones). Each phase
    alone, at its own rate: in the mix the running batch at a boundary still holds the previous phase's
    requests, which blurs the difference (docs/results.md, batching_shift_mix)."""
    cost = []
    for i in (0, 1):
        c = one_phase(cfg, i)
        lo = run(c, make_policy("batching", {"name": "eb", "theta": 0.02})).ttft.mean()
        hi = run(c, make_policy("batching", {"name": "eb", "theta": 0.3})).ttft.mean()
        cost.append(hi - lo)
    d_conv, d_code = cost
    assert d_conv > 0.5  # seconds: a refill of ~0.3 x 100 running requests waits for ~30 arrivals at 5.2 req/s
    # theory: the wait scales with mu_O x the iteration time, 7.5x apart in mu_O and iterations ~3x longer in the
    # prefill-heavy code phase; 2x is the bound that survives both
    assert d_conv > 2 * max(d_code, 0.0), (d_conv, d_code)


def test_one_choice_everywhere_is_eb(cfg):
    """The same threshold in every phase is EB with that threshold: identical request tables."""
    ora = dataclasses.replace(cfg, oracle=True)
    a = run(ora, PhaseHindsight([0.05] * 4))
    b = run(cfg, make_policy("batching", {"name": "eb", "theta": 0.05}))
    assert np.array_equal(a.finish.to_numpy(), b.finish.to_numpy(), equal_nan=True)


def test_switches_at_the_phase_boundary(cfg):
    """Until the second phase's first arrival the policy is phase 0's EB; after it, a different choice changes
    the run."""
    ora = dataclasses.replace(cfg, oracle=True)
    a = run(ora, PhaseHindsight([0.3, "mb", 0.3, "mb"]))
    b = run(cfg, make_policy("batching", {"name": "eb", "theta": 0.3}))
    boundary = a.arrival.iloc[300]
    before = (b.first_token < boundary).to_numpy()
    assert before.sum() > 100
    assert np.array_equal(a.first_token.to_numpy()[before], b.first_token.to_numpy()[before])
    assert not np.array_equal(a.finish.to_numpy(), b.finish.to_numpy(), equal_nan=True)


def test_refuses_without_oracle_or_with_wrong_count(cfg):
    with pytest.raises(ConfigError, match="oracle"):
        run(cfg, PhaseHindsight([0.1] * 4))
    with pytest.raises(ConfigError, match="choices"):
        run(dataclasses.replace(cfg, oracle=True), PhaseHindsight([0.1, 0.2]))
    with pytest.raises(ConfigError, match=r"choices\[1\]"):
        PhaseHindsight([0.1, 1.5])


def test_batching_env_teacher_action_for_cloning():
    """Threshold mode: EB's fixed theta is the grid action nearest to it, MB the MB action (choose_mode); a
    teacher whose theta depends on the run (EB*), or phase mode, is refused in one line."""
    from pdgym.envs.phase_batching import DEFAULT_GRID, make_env

    env = make_env(scenario=SCN, overrides=SMALL, mode="threshold", choose_mode=True)
    env.reset(seed=0)
    eb = make_policy("batching", {"name": "eb", "theta": 0.11})
    a = env.teacher_action(eb)
    assert DEFAULT_GRID[a] == 0.1
    env.step(a)
    assert env.core.unit_state(0, 0).theta == 0.1 and not env.core.unit_state(0, 0).mb
    assert env.teacher_action(make_policy("batching", "mb")) >= len(DEFAULT_GRID)
    with pytest.raises(ConfigError, match="eb_star"):
        env.teacher_action(make_policy("batching", "eb_star"))
    phase = make_env(scenario=SCN, overrides=SMALL)
    phase.reset(seed=0)
    with pytest.raises(ConfigError, match="mode=threshold"):
        phase.teacher_action(eb)
