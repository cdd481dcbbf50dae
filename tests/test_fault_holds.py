"""With every prefill instance down, requests wait for one to come back instead of bouncing.

A dispatch refused by a dead instance is a health report: the scheduler marks it down at once and
holds its requests (every dispatching baseline holds while no instance is healthy) until an
instance is up again or the horizon rejects them. Before: 600 requests and a 1.9 s outage of all
three instances took 276k events (a refusal every 2 x L_net per request); now about 5 per request.
"""

from __future__ import annotations

import pytest
from pdgym.baselines import make_policies
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import SimResult, Simulator


def _all_down(n: int, until: float | None, extra: tuple[str, ...] = ()) -> Simulator:
    end = "" if until is None else f", until: {until}"
    down = ",".join(f"{{instance: {i}, at: 0.1{end}}}" for i in range(3))
    sc = load_scenario("ds_v3_h800_3p1d", [f"workload.num_requests={n}", f"faults.down=[{down}]", *extra])
    sim = Simulator(sc.sim, make_policies({}), seed=0)
    sim.run()
    return sim


@pytest.mark.parametrize("n, until", [(600, 2.0), (1500, 5.0)])
def test_outage_of_every_prefill_instance_costs_a_bounded_number_of_events_per_request(n, until):
    sim = _all_down(n, until)
    assert sim.n_resolved == n
    assert sim.n_events / n < 20  # linear in the requests, whatever the outage length
    res = SimResult(sim)
    fin = res.requests[res.requests.status == "finished"]
    assert len(fin) == n and fin.ttft.max() > until - 0.1 - 1e-9  # some waited out the outage


def test_a_permanent_outage_ends_at_the_horizon_with_every_request_rejected_not_bouncing():
    sim = _all_down(300, None, ("max_sim_time_s=5.0",))
    res = SimResult(sim)
    assert sim.n_events / 300 < 20 and sim.n_resolved == 300
    assert (res.requests.status == "rejected").sum() > 0
