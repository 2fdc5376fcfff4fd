"""Size profiles: the numeric bounds a generated program must respect, as plain data.

A profile says how large dimensions, tensors, whole programs and their FLOPs may be,
which convolution/pooling parameters may be drawn, and how a program is validated
before it is kept. `paper` reproduces the paper's bounds (sized for a GPU); `tiny` keeps
everything small enough for Triton's CPU interpreter. A profile can also be read from a
JSON file holding the same fields, so a new size class needs no code.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_RANK = 5
"""Largest tensor rank the generator produces (the paper's bound)."""


@dataclass(frozen=True)
class Profile:
    """Numeric bounds for one class of programs. All element counts are float32 elements."""

    name: str
    max_dim: int
    """Every dimension lies in [1, max_dim]."""
    max_elements: int
    """Elements of any one tensor."""
    max_total_elements: int
    """Elements of all tensors of the program together (inputs, intermediates, outputs)."""
    min_input_elements: int
    """Smallest element count of a program input of rank >= 1 (the paper's SIZE_MIN)."""
    flops_min: int
    """Lower end of the FLOPs band; lowered by halving for DAGs that cannot reach it."""
    flops_max: int
    """Upper end of the FLOPs band; never exceeded."""
    kernel_sizes: tuple[int, int]
    """Inclusive range of convolution/pooling kernel sizes (one int for every spatial dim)."""
    strides: tuple[int, int]
    dilations: tuple[int, int]
    conv_groups: tuple[int, ...]
    """Group counts a convolution draws from (uniformly)."""
    norm_groups: tuple[int, ...]
    """Group counts group_norm draws from (uniformly)."""
    max_level: int
    """Largest difficulty (number of operators) this profile accepts."""
    validation: str
    """`real`: run the program itself on CPU. `scaled`: shapes on the meta device, values
    from a scaled-down copy of the same program (same operators and parameters)."""
    scaled: Profile | None = None
    """Bounds of the scaled-down copy (only for `validation == "scaled"`)."""
    solver_deterministic_time: float = 0.01
    """CP-SAT deterministic-time budget per solve (deterministic, unlike wall time)."""

    def __post_init__(self) -> None:
        if self.validation not in ("real", "scaled"):
            raise ValueError(f"profile {self.name}: validation must be 'real' or 'scaled'")
        if self.validation == "scaled" and self.scaled is None:
            raise ValueError(f"profile {self.name}: scaled validation needs a `scaled` profile")
        if not 1 <= self.flops_min <= self.flops_max:
            raise ValueError(f"profile {self.name}: need 1 <= flops_min <= flops_max")
        if self.kernel_sizes[0] < 1 or self.kernel_sizes[0] > self.kernel_sizes[1]:
            raise ValueError(f"profile {self.name}: bad kernel_sizes {self.kernel_sizes}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - fields
        if unknown:
            raise ValueError(f"unknown profile fields: {sorted(unknown)}")
        values = dict(data)
        for key in ("kernel_sizes", "strides", "dilations", "conv_groups", "norm_groups"):
            if key in values:
                values[key] = tuple(values[key])
        if values.get("scaled") is not None:
            values["scaled"] = cls.from_dict(values["scaled"])
        return cls(**values)


_PAPER_SCALED = Profile(
    name="paper-scaled",
    max_dim=2**15,
    max_elements=2**13,
    max_total_elements=2**16,
    min_input_elements=1,
    flops_min=1,
    flops_max=2**21,
    kernel_sizes=(1, 15),
    strides=(1, 4),
    dilations=(1, 3),
    conv_groups=(1, 2, 4, 8, 16),
    norm_groups=(1, 2, 4, 8, 16, 32),
    max_level=128,
    validation="real",
)

PAPER = Profile(
    name="paper",
    max_dim=2**15,
    max_elements=2**30,
    max_total_elements=2**32,  # 16 GiB of float32 for the whole program
    min_input_elements=32,
    flops_min=2**34,
    flops_max=2**35,
    kernel_sizes=(1, 15),
    strides=(1, 4),
    dilations=(1, 3),
    conv_groups=(1, 2, 4, 8, 16),
    norm_groups=(1, 2, 4, 8, 16, 32),
    max_level=128,
    validation="scaled",
    scaled=_PAPER_SCALED,
)

TINY = Profile(
    name="tiny",
    max_dim=64,
    max_elements=2**14,
    max_total_elements=2**18,
    min_input_elements=1,
    flops_min=2**6,
    flops_max=2**20,
    kernel_sizes=(1, 5),
    strides=(1, 3),
    dilations=(1, 2),
    conv_groups=(1, 2, 4),
    norm_groups=(1, 2, 4, 8),
    max_level=128,
    validation="real",
)

PROFILES: dict[str, Profile] = {p.name: p for p in (PAPER, TINY)}


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or one read from a JSON file of the same fields."""
    if name_or_path in PROFILES:
        return PROFILES[name_or_path]
    path = Path(name_or_path)
    if path.suffix == ".json" and path.is_file():
        return Profile.from_dict(json.loads(path.read_text()))
    raise KeyError(f"unknown profile {name_or_path!r} (known: {', '.join(sorted(PROFILES))})")
