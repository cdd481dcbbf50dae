"""pdgym: a Gymnasium lab of LLM-serving clusters. Importing it registers the envs (ids "pdgym/...") with Gymnasium.

    import pdgym; gym.make("pdgym/DecodeRouting-v0")
    gym.make("pdgym:pdgym/DecodeRouting-v0")        # gymnasium imports pdgym itself: any fresh process

The second form is the one for processes that never ran your imports: RLlib env runners, AsyncVectorEnv's
spawn / forkserver workers, torch DataLoader workers. Gymnasium 1.x has no plugin entry points (1.0 removed
them), so no installed package is registered before something imports it; "pdgym:" makes gymnasium do it.

Registration does not import gymnasium (issue 36 item 2: pdgym-sim never makes an env, and gymnasium's import was
a tenth of its start-up): when gymnasium is loaded already the ids are registered now, otherwise as soon as
gymnasium's import completes (a post-import hook on `sys.meta_path`). Nor does it import the simulator until then:
the pdgym-* commands start without it. The tables registered are envs/specs.py's and envs/sim/points.py's
(`pdgym.envs.register_envs`); entry points are strings, so no env module loads until gym.make builds its env.
"""

from __future__ import annotations

import importlib.util
import sys


class _RegisterAfterGymnasium:
    """A meta path finder and loader (duck-typed: importlib.abc would cost every pdgym command its import). Finds
    `gymnasium` through the other finders and hands back their spec with itself as the loader: it runs the module as
    theirs would, then registers pdgym's envs, and leaves `sys.meta_path`. A find_spec alone (a library asking
    whether gymnasium is installed: TorchRL does, at import) leaves it in place for the real import."""

    _finding = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "gymnasium" or self._finding:
            return None
        self._finding = True  # importlib.util.find_spec asks every finder on sys.meta_path again, this one too
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return spec
        self._real = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module):
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self._real.exec_module(module)
        _register_now()


def _register_now() -> None:
    from pdgym.envs import register_envs

    register_envs()


def _register_once_gymnasium_loads() -> None:
    if "gymnasium" in sys.modules:
        _register_now()
    elif not any(isinstance(f, _RegisterAfterGymnasium) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterGymnasium())


_register_once_gymnasium_loads()
