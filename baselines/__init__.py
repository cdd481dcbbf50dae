"""Reference policies from the literature, one module per family, registered by name.

`ArrivalGate` is the base of admission control in front of any prefill dispatcher (Conductor's early rejection
and the hindsight row subclass it): subclass it and define `rejects(sim, rid)` for a gate of your own
(docs/concepts.md, "Add a policy")."""

from .registry import make_policies, make_policy, policy_class, register, registered
from .slo_admission import ArrivalGate

__all__ = ["ArrivalGate", "make_policies", "make_policy", "policy_class", "register", "registered"]
