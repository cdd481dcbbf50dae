"""`pdgym-sim` and the simulator load no heavy module until they need it (issue 13 item 3): torch, SB3
and matplotlib cost seconds of import each. Checked in a fresh interpreter (this test process has
imported everything already)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "stable_baselines3", "sb3_contrib", "matplotlib", "wandb", "tensorboard", "numba")


@pytest.mark.parametrize("module", ["pdgym.agents.apps.sim", "pdgym.envs.sim", "pdgym.baselines"])
def test_no_heavy_module_at_import(module):
    code = f"import sys, {module}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert out == "", f"importing {module} loads {out}"


def test_building_the_default_policies_loads_no_scipy():
    """pdgym-sim builds its policies from the registry, which imports every baseline module: none of them may
    pull scipy (0.7 s) at import; EB's fluid optimum imports it when it is asked for."""
    code = ("import sys; from pdgym.baselines import make_policies; "
            "make_policies({'prefill': 'sbs', 'decode': 'br0', 'batching': 'eb_plus'}); "
            "print('scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert out == "False"


@pytest.mark.parametrize("module", ["pdgym.agents.apps.sim", "pdgym.envs.sim", "pdgym.envs"])
def test_simulating_loads_no_gymnasium(module):
    """Issue 36 item 2: pdgym-sim makes no env; registering the envs waits for gymnasium's own import."""
    code = f"import sys, {module}; print('gymnasium' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert out == "False"


@pytest.mark.parametrize("first", ["pdgym.envs", "gymnasium"])
def test_the_envs_are_registered_whichever_is_imported_first(first):
    """`import pdgym.envs` then gymnasium (the post-import hook registers), or gymnasium first (registered at
    once): every formulation id and point env is gymnasium's, with its string entry point, and one makes."""
    second = "gymnasium" if first == "pdgym.envs" else "pdgym.envs"
    code = (f"import {first}, {second}, gymnasium as gym; from pdgym.envs.specs import SPECS; "
            "from pdgym.envs.sim.points import POINTS; "
            "ids = [p.env_id for p in POINTS.values()] + list(SPECS); "
            "print(sum(i in gym.registry for i in ids), len(ids)); "
            "print(type(gym.make('pdgym/DecodeRouting-v0', disable_env_checker=True).unwrapped).__name__)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert out[0] == out[1] and int(out[0]) >= 9 and out[2] == "DecodeRoutingEnv"


@pytest.mark.parametrize("module", ["pdgym.envs", "pdgym.baselines", "pdgym.envs.sim"])
def test_importing_pdgym_loads_no_pandas(module):
    """pandas is 0.37 s of CPU of import (0.58 of 0.84 s for pdgym.envs, measured quiet): it loads when a table is
    built (a result, a trace read), not when pdgym is imported (issue 37)."""
    code = f"import sys, {module}; print('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert out == "False"
