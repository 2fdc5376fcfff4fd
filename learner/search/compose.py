"""The fastest correct composition: dynamic programming over fragment boundaries (pure).

A composition cuts steps [0, n) into contiguous spans, each either converted (its best
verified kernel) or left as PyTorch. Its cost is the sum of its spans' costs, so the best
composition of [0, j) ends with some span [i, j) after the best composition of [0, i):

    best(0) = 0,   best(j) = min over spans [i, j) and their options of best(i) + cost

O(n * K) for spans of at most K steps. Costs are whatever the caller measures: kernel and
eager milliseconds on a GPU, or a proxy where nothing is timed. A composition that
converts nothing is the program itself, so by default at least one span must be converted
(a second DP state: whether a converted span has been used yet).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

Span = tuple[int, int]


@dataclass(frozen=True)
class SpanCost:
    """The options for one span: converted (its best verified kernel's cost) and left as
    PyTorch; None where the option does not exist."""

    converted: float | None = None
    pytorch: float | None = None


@dataclass(frozen=True)
class Choice:
    start: int
    stop: int
    converted: bool
    cost: float


@dataclass(frozen=True)
class Composition:
    choices: tuple[Choice, ...]
    cost: float

    @property
    def converted(self) -> tuple[Choice, ...]:
        return tuple(c for c in self.choices if c.converted)

    @property
    def converted_ops(self) -> int:
        return sum(c.stop - c.start for c in self.converted)


def _options(cost: SpanCost) -> list[tuple[bool, float]]:
    found = []
    for converted, value in ((True, cost.converted), (False, cost.pytorch)):
        if value is None:
            continue
        if math.isnan(value) or value < 0:
            raise ValueError(f"a span's cost must be a non-negative number, got {value}")
        found.append((converted, value))
    return found


def best_composition(
    n: int,
    costs: Mapping[Span, SpanCost],
    *,
    require_converted: bool = True,
) -> Composition | None:
    """The cheapest composition of steps [0, n), or None when none exists.

    Ties go to fewer spans (larger fragments: fewer launches), then to the first found in
    order of span start. With `require_converted`, compositions that convert nothing are
    not considered.
    """
    if n < 1:
        raise ValueError(f"a program has at least one step, got n={n}")
    by_stop: dict[int, list[tuple[int, bool, float]]] = {}
    for (start, stop), cost in costs.items():
        if not 0 <= start < stop <= n:
            raise ValueError(f"span [{start}, {stop}) is outside [0, {n})")
        for converted, value in _options(cost):
            by_stop.setdefault(stop, []).append((start, converted, value))
    # best[j][used]: (cost, spans, choice, previous used-state), `used` = a converted span so far.
    Best = tuple[float, int, Choice | None, int]
    best: list[list[Best | None]] = [[None, None] for _ in range(n + 1)]
    best[0][0] = (0.0, 0, None, 0)
    for stop in range(1, n + 1):
        for start, converted, value in sorted(by_stop.get(stop, []), key=lambda o: o[:2]):
            for used in (0, 1):
                before = best[start][used]
                if before is None:
                    continue
                now = 1 if (used or converted) else 0
                entry = (
                    before[0] + value,
                    before[1] + 1,
                    Choice(start, stop, converted, value),
                    used,
                )
                current = best[stop][now]
                if current is None or (entry[0], entry[1]) < (current[0], current[1]):
                    best[stop][now] = entry
    states = [1] if require_converted else [0, 1]
    ends = [(best[n][s], s) for s in states if best[n][s] is not None]
    if not ends:
        return None
    end, state = min(ends, key=lambda e: (e[0][0], e[0][1]))  # type: ignore[index]
    choices: list[Choice] = []
    position, entry = n, end
    while position > 0:
        assert entry is not None and entry[2] is not None
        choice = entry[2]
        choices.append(choice)
        state = entry[3]
        position = choice.start
        entry = best[position][state]
    return Composition(tuple(reversed(choices)), end[0])  # type: ignore[index]


def segments(composition: Composition) -> list[tuple[Choice, ...]]:
    """Maximal runs of adjacent converted spans: each becomes one all-Triton candidate."""
    runs: list[list[Choice]] = []
    for choice in composition.choices:
        if not choice.converted:
            runs.append([])
        elif runs and runs[-1] and runs[-1][-1].stop == choice.start:
            runs[-1].append(choice)
        else:
            runs.append([choice])
    return [tuple(run) for run in runs if run]
