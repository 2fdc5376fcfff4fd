"""The curriculum's transitions: promotion, plateau, and its JSON state."""

from __future__ import annotations

import json

import pytest

from learner.rl.curriculum import Curriculum


def test_promotes_above_the_threshold_and_restarts_the_plateau_count() -> None:
    c = Curriculum(levels=(1, 2, 5), promote_at=0.5, patience=2)
    c = c.record(10, 0.3)
    assert (c.level, c.best, c.since_best) == (1, 0.3, 0)
    c = c.record(20, 0.2)
    assert (c.level, c.since_best, c.done) == (1, 1, False)
    c = c.record(30, 0.25)
    assert (c.level, c.since_best, c.done) == (1, 2, False), "no plateau stop below the top"
    c = c.record(40, 0.5)
    assert c.level == 1, "promotion needs strictly more than promote_at"
    c = c.record(50, 0.51)
    assert (c.level, c.best, c.since_best) == (2, None, 0)
    c = c.record(60, 0.9)
    assert c.level == 5 and c.at_last_level
    assert [e.level for e in c.history] == [1, 1, 1, 1, 1, 2]


def test_stops_on_a_plateau_at_the_last_level_only() -> None:
    c = Curriculum(levels=(1, 2), promote_at=0.5, patience=2, index=1)
    c = c.record(1, 0.6)
    c = c.record(2, 0.95)  # at the last level a high pass@1 is an improvement, not a promotion
    assert (c.level, c.best, c.done) == (2, 0.95, False)
    c = c.record(3, 0.95)  # equal is no improvement
    assert (c.since_best, c.done) == (1, False)
    c = c.record(4, 0.7)
    assert c.done and c.stopped == "plateau"
    with pytest.raises(ValueError, match="stopped"):
        c.record(5, 0.99)


def test_patience_zero_never_stops() -> None:
    c = Curriculum(levels=(1,), patience=0)
    for step in range(20):
        c = c.record(step, 0.1)
    assert not c.done and c.since_best == 19


def test_state_round_trips_through_json_and_is_checked() -> None:
    c = Curriculum(levels=(1, 2, 5), promote_at=0.4, patience=3).record(5, 0.45).record(9, 0.1)
    again = Curriculum.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again == c
    again.check_settings((1, 2, 5), 0.4, 3)
    with pytest.raises(ValueError, match="levels"):
        again.check_settings((1, 2), 0.4, 3)
    with pytest.raises(ValueError, match="curriculum"):
        Curriculum.from_dict({"version": 99})
    with pytest.raises(ValueError, match="malformed"):
        Curriculum.from_dict({"version": 1, "levels": [1]})


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError):
        Curriculum(levels=())
    with pytest.raises(ValueError):
        Curriculum(levels=(1,), promote_at=1.5)
    with pytest.raises(ValueError, match="pass@1"):
        Curriculum(levels=(1,)).record(1, 1.2)
