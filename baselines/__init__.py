"""Reference policies from the literature, one module per family, registered by name."""

from .registry import make_policies, make_policy, policy_class, register, registered

__all__ = ["make_policies", "make_policy", "policy_class", "register", "registered"]
