"""The RL curriculum as a pure state machine: which level to train on, when to move up, when to stop.

Levels are visited in order (default 1 → 2 → 5). After each held-out evaluation at the
current level (pass@1, greedy):

- above `promote_at` and not at the last level: move to the next level; the best pass@1
  and the plateau count start again there;
- otherwise a pass@1 above the best so far is an improvement (count reset), anything else
  adds one to the count of evaluations without improvement;
- at the last level, `patience` evaluations in a row without improvement end the run
  ("plateau"; patience 0 never stops).

The state is a small JSON dict saved in every checkpoint (`to_dict` / `from_dict`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Evaluation:
    step: int
    level: int
    pass_at_1: float


@dataclasses.dataclass(frozen=True)
class Curriculum:
    """Where the run stands. Frozen: every transition returns a new state."""

    levels: tuple[int, ...]
    promote_at: float = 0.5
    patience: int = 3
    index: int = 0
    best: float | None = None
    since_best: int = 0
    stopped: str = ""  # "" while running; else why the curriculum ended
    history: tuple[Evaluation, ...] = ()

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError("a curriculum needs at least one level")
        if not 0 <= self.index < len(self.levels):
            raise ValueError(f"level index {self.index} outside {len(self.levels)} levels")
        if not 0 <= self.promote_at <= 1:
            raise ValueError("promote_at must be in [0, 1]")
        if self.patience < 0:
            raise ValueError("patience must be >= 0")

    @property
    def level(self) -> int:
        return self.levels[self.index]

    @property
    def at_last_level(self) -> bool:
        return self.index == len(self.levels) - 1

    @property
    def done(self) -> bool:
        return bool(self.stopped)

    def record(self, step: int, pass_at_1: float) -> Curriculum:
        """The state after a held-out evaluation at `step` that gave `pass_at_1`."""
        if not (isinstance(pass_at_1, int | float) and 0 <= pass_at_1 <= 1):
            raise ValueError(f"pass@1 must be in [0, 1], got {pass_at_1!r}")
        if self.done:
            raise ValueError(f"the curriculum has already stopped ({self.stopped})")
        history = (*self.history, Evaluation(step, self.level, float(pass_at_1)))
        if pass_at_1 > self.promote_at and not self.at_last_level:
            return dataclasses.replace(
                self, index=self.index + 1, best=None, since_best=0, history=history
            )
        if self.best is None or pass_at_1 > self.best:
            return dataclasses.replace(self, best=float(pass_at_1), since_best=0, history=history)
        since = self.since_best + 1
        plateau = self.at_last_level and self.patience > 0 and since >= self.patience
        return dataclasses.replace(
            self, since_best=since, stopped="plateau" if plateau else "", history=history
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "levels": list(self.levels),
            "promote_at": self.promote_at,
            "patience": self.patience,
            "index": self.index,
            "best": self.best,
            "since_best": self.since_best,
            "stopped": self.stopped,
            "history": [dataclasses.asdict(e) for e in self.history],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Curriculum:
        """A saved state; anything malformed is a ValueError saying what."""
        if not isinstance(data, Mapping) or data.get("version") != STATE_VERSION:
            raise ValueError(f"not a curriculum state (version {STATE_VERSION})")
        try:
            best = data["best"]
            if best is not None and not math.isfinite(best):
                raise ValueError(f"best pass@1 {best!r}")
            return cls(
                levels=tuple(int(level) for level in data["levels"]),
                promote_at=float(data["promote_at"]),
                patience=int(data["patience"]),
                index=int(data["index"]),
                best=None if best is None else float(best),
                since_best=int(data["since_best"]),
                stopped=str(data["stopped"]),
                history=tuple(
                    Evaluation(int(e["step"]), int(e["level"]), float(e["pass_at_1"]))
                    for e in data["history"]
                ),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"malformed curriculum state: {err!r}") from None

    def check_settings(self, levels: Sequence[int], promote_at: float, patience: int) -> None:
        """Refuse to resume under other curriculum settings (the path would differ)."""
        if (tuple(levels), promote_at, patience) != (self.levels, self.promote_at, self.patience):
            raise ValueError(
                f"the saved curriculum has levels {list(self.levels)}, promote_at "
                f"{self.promote_at}, patience {self.patience}; this run asks for "
                f"{list(levels)}, {promote_at}, {patience}"
            )
