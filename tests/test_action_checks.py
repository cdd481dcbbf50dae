"""The engine checks every action a policy takes, and a policy's failure is one line (issue 44, item 3).

A batch beyond the unit's token budget, a request twice in one batch, a negative token count, a request another
unit holds, a dispatch or admission to an instance or worker that does not exist, a request nobody holds: each
is refused with one `ActionError` line naming the policy, the call and the rule, before the run changes. A policy
that raises is one `PolicyError` line (policy, call, exception). From pdgym-sim both are exit 2, one line on
stderr, no result file; HYDRA_FULL_ERROR=1 adds the policy's traceback. Before these checks the 33,538-token
batch ran, the duplicate was accepted, the negative take admitted a request that never finished, and a raise in
route() was Hydra's traceback.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import ActionError, Batch, BatchingPolicy, DecodeRouter, PolicyError, Simulator, simulate
from pdgym.envs.sim import requests as R
from pdgym.envs.sim.policy import RoundRobinDispatch

BIN = Path(sys.executable).parent
COLOC = ("coloc_h100_qwen3_8b", ["workload.num_requests=60", "workload.concurrency=16",
                                 "cluster.colocated.chunk_tokens=2048", "cluster.colocated.count=2"])
DECODE = ("decode_tier_n8", ["workload.num_requests=60"])


def _cfg(case):
    return load_scenario(*case).sim


class _OneBatch(BatchingPolicy):
    """Returns `pieces(view, unit facade)` as the first batch that has a waiting request, else None."""

    def __init__(self, pieces):
        self.pieces = pieces

    def next_batch(self, sim, inst, unit):
        u = sim.colocated[inst].units[unit]
        if not u.waiting:
            return None
        return Batch(prefill=self.pieces(sim, inst, u), decode=False)


def _whole_prompts(sim, inst, u):
    """Every request this unit holds, its whole prompt at once, and more prompts than one budget holds: the
    issue's 33,538-token batch (bounded below by the budget, not by this run's prompts)."""
    return [(rid, int(sim.req.work[rid])) for rid in list(u.waiting)]


@pytest.mark.parametrize("pieces, rule", [
    (_whole_prompts, r"prompt tokens exceed the unit's budget chunk_tokens=2,048"),
    (lambda sim, i, u: [(u.waiting[0], 8), (u.waiting[0], 8)], r"request \d+ appears twice"),
    (lambda sim, i, u: [(u.waiting[0], -5)], r"tokens must be an integer >= 0"),
    (lambda sim, i, u: [(u.waiting[0], 8.5)], r"tokens must be an integer >= 0"),
    (lambda sim, i, u: [(10**9, 8)], r"no request 1000000000"),
    (lambda sim, i, u: [u.waiting[0]], r"is not a \(request id, tokens\) pair"),
])
def test_a_batch_that_breaks_a_rule_is_refused_in_one_line(pieces, rule):
    pol = _OneBatch(pieces)
    with pytest.raises(ActionError, match=r"^policy\.batching: _OneBatch\.next_batch\(inst=\d, unit=0\) returned a "
                       r"Batch the engine refuses: .*" + rule) as e:
        simulate(_cfg(COLOC), {"batching": pol}, seed=0)
    assert "\n" not in str(e.value)
    if pieces is _whole_prompts:  # the budget is the unit's own: the pieces together, each within its prompt
        assert int(re.search(r"refuses: ([\d,]+) prompt", str(e.value))[1].replace(",", "")) > 2048


def test_a_batch_taking_a_request_another_unit_holds_is_refused_before_anything_changes():
    class Steal(BatchingPolicy):
        def next_batch(self, sim, inst, unit):
            other = sim.colocated[1 - inst].units[0].waiting
            return Batch(prefill=[(other[0], 8)]) if other else None

    sim = Simulator(_cfg(COLOC), {"batching": Steal()}, seed=0)
    with pytest.raises(ActionError, match=r"is not waiting or prefilling on this unit") as e:
        sim.run()
    rid = int(re.search(r"request (\d+) is not", str(e.value))[1])
    assert sim.req.state[rid] == R.WAITING and rid in sim.colocated[int(sim.req.prefill_inst[rid])].units[0].waiting


class _Raises(DecodeRouter):
    def route(self, sim, inst):
        raise KeyError("no such worker")


def test_a_policy_that_raises_is_one_policy_error_line_with_its_cause_kept():
    with pytest.raises(PolicyError, match=r"^policy\.decode: _Raises\.route\(\) raised KeyError: 'no such worker' "
                       r"\(HYDRA_FULL_ERROR=1 prints its traceback\)$") as e:
        simulate(_cfg(DECODE), {"decode": _Raises()}, seed=0)
    assert isinstance(e.value.__cause__, KeyError)


class _BadDispatch(RoundRobinDispatch):
    def on_arrival(self, sim, rid):
        sim.dispatch(rid, 99)


class _BadWorker(DecodeRouter):
    def route(self, sim, inst):
        sim.admit(next(iter(sim.pool)), inst, sim.decode[inst].dp)


class _RejectStranger(RoundRobinDispatch):
    def on_arrival(self, sim, rid):
        sim.reject(rid + 1, "policy")


@pytest.mark.parametrize("policies, line", [
    ({"prefill": _BadDispatch()}, r"^policy\.prefill: _BadDispatch\.on_arrival: dispatch\(rid=0, inst=99\): no "
                                  r"instance 99; allowed 0\.\.\d+$"),
    ({"decode": _BadWorker()}, r"^policy\.decode: _BadWorker\.route: admit\(rid=\d+, inst=0, worker=\d+\): instance "
                               r"0 has workers 0\.\.\d+$"),
    ({"prefill": _RejectStranger()}, r"^policy\.prefill: _RejectStranger\.on_arrival: reject\(rid=1\): request 1 is "
                                     r"neither buffered nor pooled"),
])
def test_an_action_on_what_does_not_exist_is_refused_in_one_line(policies, line):
    with pytest.raises(ActionError, match=line):
        simulate(_cfg(DECODE), policies, seed=0)


BAD = '''from pdgym.envs.sim import Batch, BatchingPolicy, DecodeRouter


class Boom(DecodeRouter):
    def route(self, sim, inst):
        raise RuntimeError("boom")


class Huge(BatchingPolicy):
    def next_batch(self, sim, inst, unit):
        u = sim.colocated[inst].units[unit]
        return Batch(prefill=[(rid, 33538) for rid in u.waiting]) if u.waiting else None
'''


@pytest.mark.parametrize("args, says", [
    (["scenario=decode_tier_n8", "policy.decode.name=bad_policies:Boom"],
     "pdgym-sim: error: policy.decode: Boom.route() raised RuntimeError: boom"),
    (["scenario=coloc_h100_qwen3_8b", "cluster.colocated.chunk_tokens=2048", "policy.batching.name=bad_policies:Huge"],
     "pdgym-sim: error: policy.batching: Huge.next_batch(inst=0, unit=0) returned a Batch the engine refuses"),
])
def test_from_pdgym_sim_a_policys_failure_is_one_line_exit_2_and_no_result(tmp_path, args, says):
    (tmp_path / "bad_policies.py").write_text(BAD)
    env = {"WANDB_MODE": "disabled", "PATH": str(BIN)}
    run = [str(BIN / "pdgym-sim"), *args, "workload.num_requests=40", "plots=false", "hydra.run.dir=out"]
    p = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False, env=env)
    assert p.returncode == 2 and p.stderr.startswith(says), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert not list(tmp_path.glob("out/*.json")), "a failed run wrote a result"
    if "Boom" in says:  # the user asks for the policy's traceback
        p = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
                           env={**env, "HYDRA_FULL_ERROR": "1"})
        assert p.returncode == 2 and "Traceback" in p.stderr and 'raise RuntimeError("boom")' in p.stderr
        assert p.stderr.strip().splitlines()[-1].startswith(says), p.stderr
