"""How an operator is written as a PyTorch call: its names, arguments, defaults and suffix.

The generator prints one canonical spelling per operator (`Operator.render`). A reader of
programs (the teacher's parser, the KernelBench rewrite) must recognise every spelling the
functional format allows: an alias (`F.relu` for `torch.relu`), arguments given by position
or keyword, defaults left out. `Call` states those facts once, beside the operator's other
facts in the registry.

Every operator, printed with its suffix, maps float32 inputs to a float32 result (the
suffix `.float()` casts argmax's int64 indices, `.values` takes the values of a
(values, indices) pair), so a reader needs only shapes (`synth.operators.infer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final


class _Required:
    """Marks a parameter the call must give (it has no default)."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()

RankRange = tuple[int, int | None]
"""Lowest and highest rank a tensor argument may have (None: no upper bound)."""

ANY_RANK: RankRange = (0, None)


@dataclass(frozen=True)
class Call:
    """One operator's call signature, as the functional format may write it.

    `params` are the non-tensor parameters a program may pass, in PyTorch's positional
    order, each with PyTorch's default (`REQUIRED` where it has none); parameters outside
    this list are not part of the format. `ranks` gives, per tensor argument, the ranks
    the call accepts (PyTorch's rule, narrowed where the format is: a reduction needs
    rank >= 1); empty means any rank for every tensor.
    """

    names: tuple[str, ...]
    """Dotted callee names, the canonical one (the one `render` prints) first, then
    aliases (`F.relu` for `torch.relu`); `torch.nn.functional` is written `F`."""
    tensors: tuple[str, ...] = ("input",)
    """Keyword names of the tensor arguments, in positional order. With `tensor_list`,
    the single name of the list argument."""
    params: tuple[tuple[str, Any], ...] = ()
    suffix: str | None = None
    """What must follow the call: `.values` (max, cummax, ...) or `.float()` (argmax)."""
    tensor_list: bool = False
    """The tensors come as one list argument (`torch.cat([a, b], dim=0)`)."""
    numbers: tuple[str, ...] = ()
    """Tensor arguments that may instead be a Python number (lerp's `weight`, either
    operand of add, sub, mul and div), where PyTorch takes one; a number is a 0-d operand
    (it broadcasts to any shape), and at least one argument stays a tensor."""
    ranks: tuple[RankRange, ...] = ()
    same_rank: bool = False
    """Every tensor argument has the same rank (cat, stack)."""

    @property
    def name(self) -> str:
        """The canonical callee, as the generator prints it."""
        return self.names[0]

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.params)

    def number_error(self, names: Sequence[str]) -> str | None:
        """Why the tensor arguments `names` may not be Python numbers, or None if they may."""
        for name in names:
            if name not in self.numbers:
                return f"`{name}` must be a tensor, not a Python number"
        if names and len(set(names)) >= len(self.tensors):
            return "at least one operand must be a tensor, not every one a Python number"
        return None

    def rank_error(self, ranks: Sequence[int]) -> str | None:
        """Why tensor arguments of these ranks do not fit the call, or None if they do."""
        for i, rank in enumerate(ranks):
            lo, hi = self.ranks[i] if i < len(self.ranks) else ANY_RANK
            if rank < lo or (hi is not None and rank > hi):
                want = f"{lo}" if lo == hi else f">= {lo}" if hi is None else f"{lo} to {hi}"
                which = self.tensors[min(i, len(self.tensors) - 1)]
                return f"`{which}` must have rank {want}, not {rank}"
        if self.same_rank and len(set(ranks)) > 1:
            return f"its tensors must have one rank, not {list(ranks)}"
        return None


def is_number(value: Any) -> bool:
    """A Python int or float, as a number operand may be (a bool is not: it is a flag)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def min_rank(rank: int, count: int = 1) -> tuple[RankRange, ...]:
    """`count` tensor arguments, each of rank >= `rank`."""
    return ((rank, None),) * count
