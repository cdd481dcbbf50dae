"""The prefix-cache index (issue 36 item 3): the units holding each block, kept by the caches, so a cache-aware
router walks a prompt once per instance and keys one unit per group of equal hits instead of every unit.
Proved against the per-unit match it replaces (random cache histories) and by the routers' decisions, which
must be those of the full scan over every unit."""

from __future__ import annotations

import random

import pytest
from pdgym.baselines import make_policies
from pdgym.baselines.cache_routing import CacheTTFT, DynamoKV
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim.engine import Simulator
from pdgym.envs.sim.prefix_cache import UnitCache, UnitsIndex


def _expand(groups, n):
    out = [(0, 0)] * n
    for mask, m, h in groups:
        for u in range(n):
            if mask >> u & 1:
                assert out[u] == (0, 0), "a unit in two groups"
                out[u] = (m, h)
    return out


@pytest.mark.parametrize("eviction", ["lru", "fifo", "belady"])
@pytest.mark.parametrize("host_tokens", [0, 40])
def test_index_matches_every_units_own_match(eviction, host_tokens):
    rng = random.Random(7)
    caches = [UnitCache(24, 4, eviction, host_tokens) for _ in range(5)]  # 6 HBM blocks a unit: evictions
    index = None
    seen_host = seen_long = False
    for step in range(3000):
        if step == 300:
            index = UnitsIndex(caches)  # built mid-history: attaches what the tiers already hold
        chain = [rng.randrange(3)] + [rng.randrange(12) for _ in range(rng.randrange(0, 7))]
        c = rng.choice(caches)
        op = rng.random()
        if op < 0.6:
            c.admit(chain, [rng.randrange(10**6) for _ in chain])
        elif op < 0.8:
            m, _ = c.match(chain)
            c.lock(chain[:m], [rng.randrange(10**6) for _ in chain[:m]])
        elif op < 0.98:
            c.unlock(chain)
        else:
            c.clear()  # a failure: HBM gone, host kept
        if index is not None:
            want = [cc.match(chain) for cc in caches]
            assert _expand(index.matches(chain), len(caches)) == want
            seen_host |= any(h for _, h in want)
            seen_long |= len({m for m, _ in want}) > 2
    assert seen_long and seen_host == (host_tokens > 0)  # the histories reached the cases the index must group


class _Dense:
    """The router keyed over every unit (argmin_unit without the groups), as before the index."""

    def argmin_unit(self, sim, rid, healthy, keys, by_backlog=None):
        return super().argmin_unit(sim, rid, healthy, keys, None)


class _Log:
    """Records each decision, and how many units the router keyed for it."""

    def choose_unit(self, sim, rid, healthy):
        got = super().choose_unit(sim, rid, healthy)
        self.log.append((rid, *got))
        return got

    def argmin_unit(self, sim, rid, healthy, keys, by_backlog=None):
        def counted(i, P, units, *rest):
            self.keyed += len(units)
            return keys(i, P, units, *rest)

        return super().argmin_unit(sim, rid, healthy, counted, by_backlog)


@pytest.mark.parametrize("router", [CacheTTFT, DynamoKV])
def test_grouped_routers_decide_as_the_full_scan(router):
    cfg = load_scenario("prefix_mooncake", ["workload.num_requests=400", "cluster.prefill.cache_tokens=40960",
                                            "cluster.prefill.host_cache_tokens=200000"]).sim
    logs = []
    for cls in (type("G", (_Log, router), {}), type("D", (_Log, _Dense, router), {})):
        pol = cls()
        pol.log, pol.keyed = [], 0
        Simulator(cfg, make_policies({"prefill": pol}), seed=0).run()
        logs.append((pol.log, pol.keyed))
    (grouped, keyed), (dense, keyed_dense) = logs
    assert len(grouped) >= 400 and grouped == dense
    assert keyed_dense == 64 * len(dense)  # the full scan keys all 8 x 8 units per request
    assert keyed < 0.5 * keyed_dense  # the groups: a few units per instance
    assert len({(i, d) for _, i, d in grouped}) > 16  # the decisions spread over the units: not a trivial run
