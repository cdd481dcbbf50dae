"""envs/features.py's two forms of a row feature (all rows at once, or per_row) fill the same entries: checked
against vectors written out by hand, on the whole-list path (PhaseBatching's shape) and the grouped one."""

import numpy as np
from pdgym.envs.features import Feature, Layout, table


class _Core:
    on = True


class _Unit:
    def __init__(self, load, slots):
        self.load, self.slots = load, slots


UNITS = [_Unit(3, 4), _Unit(6, 4)]  # two filled rows of three slots
GLOB = [Feature("n", len, 0, 4, "units"), Feature("total", lambda o: sum(u.load for u in o) / 4, 0, 2, "load / 4")]


def test_per_row_features_fill_the_rows_in_order_whole_list_path():
    row = [Feature("present", lambda o, i, u: 1.0, 0, 1, "present", per_row=True),
           Feature("load", lambda o, i, u: u.load / u.slots, 0, 1, "load / slots", per_row=True),
           Feature("index", lambda o, i, u: (float(i), 2.0 * i), 0, 9, "i, 2 i", width="2", per_row=True)]
    lay = Layout(GLOB, row, _Core(), {}, 3)
    assert lay._flat
    v = lay.build(UNITS, 2, UNITS)
    # global: 2 units, 9 / 4 clipped to 2; rows: (1, 3/4, 0, 0), (1, 6/4 clipped to 1, 1, 2), padding
    assert v.tolist() == [2, 2, 1, 0.75, 0, 0, 1, 1, 1, 2, 0, 0, 0, 0]
    assert lay.build([], 0, []).tolist() == [0] * 14  # no units: every row padding


def test_per_row_and_whole_row_features_mixed_grouped_path():
    """A per_row block between two whole-row features, and a global block: positions follow the declaration."""
    glob = [*GLOB, Feature("pair", lambda o: np.array([0.5, 5.0]), 0, 1, "pair", width="2")]
    row = [Feature("a", lambda o: np.array([-1.0, 0.25]), -0.5, 1, "a"),
           Feature("hot", lambda o, i, u: (1.0, 0.0) if u.load > 4 else (0.0, 1.0), 0, 1, "one-hot", width="2",
                   per_row=True),
           Feature("b", lambda o: np.array([[7.0, 0.5], [0.5, 7.0]]), 0, 5, "b", width="2"),
           Feature("load", lambda o, i, u: u.load, 0, 5, "load", per_row=True)]
    lay = Layout(glob, row, _Core(), {}, 3)
    assert not lay._flat
    v = lay.build(UNITS, 2, UNITS)
    assert v.tolist() == [2, 2, 0.5, 1,
                          -0.5, 0, 1, 5, 0.5, 3,
                          0.25, 1, 0, 0.5, 5, 5,
                          0, 0, 0, 0, 0, 0]
    # the declaration's table does not depend on the form
    whole = [Feature(f.name, None, f.low, f.high, f.meaning, f.width) for f in row]
    assert table(glob, row) == table(glob, whole)
