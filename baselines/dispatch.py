"""Classic immediate dispatchers: every arrival goes to an instance at once; the engine picks the DP unit.

This is what SBS is measured against (ALGORITHMS.md s1): the instance queues the request
on its least-loaded DP unit (FIFO) and a busy instance makes it wait for the pass in
progress. Round robin is the engine default (`round_robin`, pdgym.envs.sim.policy); the
others choose by load as the scheduler can observe it: device queue depth (requests
dispatched and not yet through prefill) or outstanding prefill tokens. Ties rotate, so a
tie never piles onto instance 0. On a colocated cluster the same rules read the
instance's waiting and running requests.
"""

from __future__ import annotations

from pdgym.envs.sim.policy import PrefillScheduler

from .registry import register


def queue_depth(sim, inst: int) -> int:
    """Requests dispatched to `inst` whose prefill has not finished (wire + device queue + pass)."""
    if sim.disaggregated:
        return sim.prefill[inst].depth
    return sum(len(u.waiting) + len(u.prefilling) for u in sim.colocated[inst].units)


def outstanding_tokens(sim, inst: int) -> int:
    """Prefill tokens still to compute on `inst` (wire + device queue + pass in progress)."""
    if sim.disaggregated:
        return int(sim.prefill[inst].load_tokens().sum())
    work = sim.req.work
    return int(sum(work[r] for u in sim.colocated[inst].units for r in (*u.waiting, *u.prefilling)))


class ImmediateDispatch(PrefillScheduler):
    """Dispatch each arrival at once to `choose(sim, healthy)`; hold only while no instance is healthy."""

    def reset(self, sim) -> None:
        self._turn = 0

    def choose(self, sim, healthy: list[int]) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def on_arrival(self, sim, rid: int) -> None:
        healthy = sim.healthy_prefill()
        if healthy:
            sim.dispatch(rid, self.choose(sim, healthy))

    def on_topology_change(self, sim) -> None:
        for rid in list(sim.buffer):
            self.on_arrival(sim, rid)

    def _argmin(self, healthy: list[int], key) -> int:
        """Instance with the smallest key; ties broken by a rotating offset."""
        n = len(healthy)
        self._turn += 1
        t = self._turn
        return min(healthy, key=lambda i: (key(i), (i - t) % n))


@register("prefill", "random")
class RandomDispatch(ImmediateDispatch):
    """Uniformly random healthy instance (the policies' generator `sim.rng`, so seeded)."""

    def choose(self, sim, healthy: list[int]) -> int:
        return healthy[int(sim.rng.integers(len(healthy)))]


@register("prefill", "jsq")
class JoinShortestQueue(ImmediateDispatch):
    """Join the shortest queue: the instance with the fewest unfinished prefill requests."""

    def choose(self, sim, healthy: list[int]) -> int:
        return self._argmin(healthy, lambda i: queue_depth(sim, i))


@register("prefill", "least_tokens")
class LeastOutstandingTokens(ImmediateDispatch):
    """The instance with the fewest outstanding prefill tokens (a token-weighted JSQ)."""

    def choose(self, sim, healthy: list[int]) -> int:
        return self._argmin(healthy, lambda i: outstanding_tokens(sim, i))
