"""docs/clients.md's Tianshou example (issue 45): DQN over two pdgym envs with the mask in obs.mask. Tianshou 2.x moves
pandas to 2.x, so it is not a dev dependency: `make tianshou-check` runs this in a side environment; `make test`
skips it."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tianshou")

from conftest import doc_example  # noqa: E402


def test_tianshou_example_trains_and_acts_within_the_mask():
    ns = doc_example("tianshou")
    buffer, result = ns["buffer"], ns["result"]
    assert result.train_step == 64 and len(buffer) == 64 and result.update_step >= 1
    data = buffer[buffer.sample_indices(0)]  # every stored transition (sample size 0: all, across both sub-buffers)
    assert len(data.act) == 64 and data.obs.mask[np.arange(64), data.act].all()  # every action collected (exploration too) allowed
