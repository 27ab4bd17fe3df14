"""Levels set how much of a check runs, never whether it runs; a long check says how far it is."""

import pytest

from sparkgate.levels import LEVELS, LONG_SHAPE_CHECKS, MIN_OUTPUT
from sparkgate.progress import Steps
from sparkgate.recipes import FLOOR_CHECKS


@pytest.mark.parametrize("name", list(LEVELS))
def test_every_level_runs_every_check_but_the_long_shapes_below_extended(name):
    level = LEVELS[name]
    assert all(level.runs(c) for c in set(FLOOR_CHECKS.values()) - set(LONG_SHAPE_CHECKS))
    assert all(level.runs(c) for c in LONG_SHAPE_CHECKS) == (name == "extended")


def test_the_levels_grow_in_what_they_run():
    quick, standard, extended = LEVELS["quick"], LEVELS["standard"], LEVELS["extended"]
    for field in ("natural_requests", "forced_rounds", "single_rounds", "batch_rounds", "counted_requests"):
        assert getattr(quick, field) <= getattr(standard, field) <= getattr(extended, field), field
    assert quick.tokens(400) == 100 and quick.tokens(128) == MIN_OUTPUT and standard.tokens(400) == 400
    assert quick.capacity_limit(4) == standard.capacity_limit(4) == 4 and extended.capacity_limit(4) == 8


def test_a_steps_estimate_is_the_pace_so_far_times_the_steps_left():
    said, now = [], [100.0]
    steps = Steps(said.append, "PERF-X, quick", 4, clock=lambda: now[0])
    steps("burst 1")
    now[0] += 10
    steps("burst 2")
    now[0] += 20
    steps("burst 3")
    assert said == ["  [PERF-X, quick] 1/4 burst 1: 0 s so far",
                    "  [PERF-X, quick] 2/4 burst 2: 10 s so far, about 30 s left",
                    "  [PERF-X, quick] 3/4 burst 3: 30 s so far, about 30 s left"]
