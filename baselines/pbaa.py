"""PBAA: Prioritized Batch Allocation (SBS Algorithm 2, arXiv 2512.16134, ALGORITHMS.md s2).

A released batch is spread over the DP units of one prefill instance so that no unit is
handed more than one pass's worth of work:

    C_avail(d) = C_chunk - U_flight(d) - R_queued(d)

GreedyDispatch(Q) sorts Q by prompt length, descending, and puts each request on
d* = argmax_d Cap(r, d), Cap = C_avail(d) - L(r) (basic) or C_avail(d) - (L(r) - L_hit(r, d))
(cache aware); it is assigned only if C_avail(d*) > 0 (C_avail(d*) then becomes Cap(r, d*)
and may go negative: the engine chunks the rest over later passes), otherwise it waits for
the next cycle. Requests left over from earlier cycles go first (FCFS fairness); each
cycle a request is left over its wait counter grows, and past N_limit flow control
throttles new arrivals or rejects it with reason "flow_control".

`CapacityModel` is what the scheduler knows about the units: the tokens it dispatched
that no EndForward has acknowledged yet (U_flight, its own bookkeeping) and the device
queues the last EndForward or quiescence poll reported (R_queued). It also keeps the
sliding window of forward times that SBS's interval control reads.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.cost import pass_overhead_free  # noqa: F401  (placeholder, replaced below)
