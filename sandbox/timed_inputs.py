"""What a timed loop runs on and what the grader may check of it: input sets, rotation,
kept outputs, the grader's pick. Shared by the grader and the candidate's harness.

A candidate times itself in its own process, so the loop is built to leave nothing to gain
from knowing it is timed:

- Distinct inputs. The grader stages several input sets (distinct draws: distinct values in
  distinct memory). The warm-ups run on a set of their own and each timed run on a set no
  call used before, so a cache keyed on an input's identity, its address or a sample of
  its values never hits. Larger inputs get fewer sets, in rotation (no two consecutive runs
  on one), and fewer runs: more than half of them still see a fresh set, so answers from
  a cache cannot move the median past the runs that computed (`plan_timing`); huge inputs
  get one set or two (`TimingPlan.note` says so in the result). The host-clock loop
  alternates between two sets (`TimingPlan.wall_sets`).
- Kept outputs, checked after the loop. The harness keeps the outputs of the loop's last
  `keep` calls; after the loop the grader draws `TIMED_PICKS` of them at random (a choice
  the candidate cannot see while it runs) and judges them against the reference of each
  call's own set. Where outputs are too large to keep them all, the loop counts fewer runs:
  never more than `2 * keep - 1`, so most of the runs that count can be picked, and skipping
  the work of the others cannot move the median past the runs that did it.
- No reused answers. Outputs of distinct calls must be distinct memory, apart from the
  inputs (`reused_outputs`): returning an earlier call's tensor again is caught even where
  the inputs repeat.

- No set before its turn. The sets cross to the candidate packed into one buffer
  (`pack_layout`): one transfer, and device memory shared with the grader once the sets
  are large enough. The harness keeps them in host memory and copies each onto the device
  just before the first call that uses it (`set_spans`): a call cannot compute a later
  call's answer ahead of time, whatever memory it reads.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Staged inputs of a loop, all sets together: what more sets may cost.
TIMING_SETS_BYTES = 2**30
# At least this many sets where they fit (and there are that many calls).
MIN_INPUT_SETS = 4
# Never more staged than this: huge inputs get fewer sets (down to one).
MAX_STAGED_BYTES = 2 * 2**30
# Outputs the harness keeps for the grader's pick, per loop (`keep` calls' worth).
KEPT_OUTPUT_BYTES = 2**30
MIN_KEPT = 2
# ... and of the host-clock loop (`TimingPlan.wall_keep`).
WALL_KEPT = 4
# Kept calls the grader judges, per loop.
TIMED_PICKS = 3
# Each tensor of a packed set starts on a boundary this large (the allocator's own).
PACK_ALIGN = 512


@dataclass(frozen=True)
class TimingPlan:
    """One candidate's timed loops: `sets` staged input sets, `runs` timed runs after
    `warmup` warm-up calls, outputs of the last `keep` calls of each loop kept."""

    sets: int
    runs: int
    warmup: int
    keep: int
    wanted_runs: int  # the runs asked for, before the limits that keep them checkable

    @property
    def fresh(self) -> int:
        """Sets only timed runs use (the warm-ups have one of their own, where there are
        three sets or more): a timed run on one of them is its first call on it."""
        return self.sets - 1 if self.sets >= 3 else 0

    @property
    def wall_sets(self) -> int:
        """Sets the host-clock loop alternates between: two, so that consecutive calls
        differ while a small problem's inputs stay in the L2 cache, as back-to-back calls
        of one kernel find them (the host clock bounds the events' figure from below)."""
        return min(2, self.sets)

    @property
    def wall_keep(self) -> int:
        """Calls whose outputs the host-clock loop keeps: a few, in memory that stays in the
        L2 cache as one output buffer would (its calls run back to back, uncached by a
        flush, and a ring of cold outputs would slow them where one kernel alone would not)."""
        return min(self.keep, WALL_KEPT)

    def set_of(self, call: int, wall: bool = False) -> int:
        """The input set call `call` of a loop (warm-ups first) runs on."""
        if wall:
            return call % self.wall_sets
        if not self.fresh:
            return call % self.sets
        if call < self.warmup:
            return self.sets - 1
        return (call - self.warmup) % self.fresh

    def schedule(self, calls: int, wall: bool = False) -> list[int]:
        """The set of each of a loop's `calls` calls (what the harness is told)."""
        return [self.set_of(call, wall) for call in range(calls)]

    @property
    def note(self) -> str:
        """What the result says about a plan short of the full one ('' when it is full)."""
        parts = []
        if self.fresh < self.runs:
            sets = "1 input set" if self.sets == 1 else f"{self.sets} input sets"
            parts.append(f"{sets} for {self.runs} timed runs: inputs repeat")
        if self.runs < self.wanted_runs:
            parts.append(
                f"{self.runs} timed runs, not {self.wanted_runs}, so that most of them are "
                f"checkable ({self.keep} kept) and see inputs for the first time"
            )
        return "; ".join(parts)


def input_sets(input_bytes: int, wanted: int) -> int:
    """How many input sets to stage: `wanted`, within what inputs this large may take."""
    wanted = max(1, wanted)
    if input_bytes <= 0:
        return wanted
    sets = min(wanted, max(MIN_INPUT_SETS, TIMING_SETS_BYTES // input_bytes))
    if sets * input_bytes > MAX_STAGED_BYTES:
        sets = max(1, MAX_STAGED_BYTES // input_bytes)
    return sets


def plan_timing(input_bytes: int, output_bytes: int, runs: int, warmup: int) -> TimingPlan:
    """The loops of a problem whose inputs and outputs take these bytes (one set each).

    Every timed run gets a set no call used before where they fit (one more for the
    warm-ups); otherwise the runs that count are cut so that more than half of them do,
    and more than half are among the outputs kept: a run skipped or answered from a cache
    can then only ever pull the median down to the quickest run that did the work."""
    runs = max(1, runs)
    keep = (
        runs if output_bytes <= 0 else min(runs, max(MIN_KEPT, KEPT_OUTPUT_BYTES // output_bytes))
    )
    counted = min(runs, 2 * keep - 1)
    sets = input_sets(input_bytes, counted + 1)
    plan = TimingPlan(sets=sets, runs=counted, warmup=warmup, keep=keep, wanted_runs=runs)
    if plan.fresh:
        counted = min(counted, max(plan.fresh, 2 * plan.fresh - 1))
    return TimingPlan(
        sets=sets, runs=counted, warmup=warmup, keep=min(keep, counted), wanted_runs=runs
    )


def extra_bytes(plan: TimingPlan, input_bytes: int, output_bytes: int) -> tuple[int, int]:
    """GPU memory the plan needs beyond one set of inputs and three of outputs (what a
    job's reservation counts already): (the candidate's, the grader's)."""
    staged = max(0, plan.sets - 1) * input_bytes
    kept = max(0, plan.keep + 1 - 3) * output_bytes  # the kept calls and one in flight
    # The candidate may hold its own copy of the sets (files) and its kept outputs; the
    # grader its private copy of the sets and the one it shares (until the candidate maps it).
    return staged + kept, 2 * staged


def picks(kept_calls: Sequence[int], count: int = TIMED_PICKS) -> list[int]:
    """`count` of the kept calls, drawn by the grader after the loop (secret), in order."""
    pool = list(kept_calls)
    chosen: list[int] = []
    for _ in range(min(count, len(pool))):
        chosen.append(pool.pop(secrets.randbelow(len(pool))))
    return sorted(chosen)


def kept_calls(calls: int, keep: int) -> range:
    """The calls of a loop of `calls` calls whose outputs the harness keeps: the last `keep`."""
    return range(max(0, calls - keep), calls)


def layout_bytes(layout: Sequence[dict[str, Any]]) -> int:
    """Bytes of one set's tensors, as `Problem.input_layout` describes them (entries with a
    `shape` and a `dtype` name; other values take no device memory)."""
    return sum(_entry_bytes(entry) for entry in layout if "shape" in entry)


def _entry_bytes(entry: dict[str, Any]) -> int:
    """Bytes of the tensor a layout entry (`shape`, `dtype` name) describes."""
    import torch

    return math.prod(entry["shape"]) * getattr(torch, entry["dtype"]).itemsize


# -- packing the sets into one buffer ------------------------------------------------------
def _aligned(offset: int) -> int:
    return (offset + PACK_ALIGN - 1) // PACK_ALIGN * PACK_ALIGN


def pack_layout(sets: Sequence[Sequence[Any]]) -> tuple[list[list[dict[str, Any]]], int]:
    """Where each tensor of each set goes in one byte buffer: per set, per input,
    `{"offset", "shape", "dtype"}` (contiguous) or `{"value"}` for a non-tensor; and the
    buffer's size. Tensors are described by `shape`, `dtype` and `nbytes` attributes (a
    torch tensor, or a stand-in in tests)."""
    import torch

    layout: list[list[dict[str, Any]]] = []
    offset = 0
    for values in sets:
        entries = []
        for value in values:
            if not isinstance(value, torch.Tensor):
                entries.append({"value": value})
                continue
            offset = _aligned(offset)
            entries.append(
                {
                    "offset": offset,
                    "shape": list(value.shape),
                    "dtype": str(value.dtype).removeprefix("torch."),
                }
            )
            offset += value.numel() * value.element_size()
        layout.append(entries)
    return layout, _aligned(offset)


def set_spans(layout: Sequence[Sequence[dict[str, Any]]]) -> list[tuple[int, int]]:
    """Per set of a `pack_layout`, the bytes of the buffer its tensors occupy: (start,
    length), (0, 0) for a set without tensors. The harness copies a set onto the device
    by its span; the grader works the spans out and sends them (nothing computed in the
    candidate's process, where `math` and `torch`'s dtypes are the candidate's to patch)."""
    spans = []
    for entries in layout:
        placed = [e for e in entries if "offset" in e]
        if not placed:
            spans.append((0, 0))
            continue
        start = min(e["offset"] for e in placed)
        end = max(e["offset"] + _entry_bytes(e) for e in placed)
        spans.append((start, end - start))
    return spans


def pack(sets: Sequence[Sequence[Any]], device: Any) -> tuple[Any, list[list[dict[str, Any]]]]:
    """The sets copied into one uint8 buffer on `device`, and its layout (`pack_layout`)."""
    import torch

    layout, size = pack_layout(sets)
    buffer = torch.zeros(max(size, 1), dtype=torch.uint8, device=device)
    for values, entries in zip(sets, layout, strict=True):
        for value, entry in zip(values, entries, strict=True):
            if "offset" in entry and value.numel():
                view = unpacked_view(buffer, entry)
                view.copy_(value)
    return buffer, layout


def unpacked_view(
    buffer: Any,
    entry: dict[str, Any],
    narrow: Any = None,
    view: Any = None,
    dtypes: Mapping[str, Any] | None = None,
) -> Any:
    """The tensor `entry` (of `pack_layout`) describes, as a view of `buffer`. `narrow`,
    `view` and `dtypes` (name to dtype) are what to use (the harness passes ones bound
    before any candidate code ran)."""
    import torch

    narrow = narrow or torch.Tensor.narrow
    view = view or torch.Tensor.view
    dtype = dtypes[entry["dtype"]] if dtypes is not None else getattr(torch, entry["dtype"])
    nbytes = math.prod(entry["shape"]) * dtype.itemsize
    flat = view(narrow(buffer, 0, entry["offset"], nbytes), dtype)
    return view(flat, entry["shape"])


def unpack(
    buffer: Any, layout: Sequence[Sequence[dict[str, Any]]], **methods: Any
) -> list[list[Any]]:
    """Every set as views of `buffer` (non-tensor values as they are); `methods` as for
    `unpacked_view`."""
    return [
        [e["value"] if "value" in e else unpacked_view(buffer, e, **methods) for e in entries]
        for entries in layout
    ]


# -- what the harness checks of a loop's kept outputs --------------------------------------
def reused_outputs(
    kept: Iterable[tuple[int, Sequence[int]]], forbidden: Iterable[int] = ()
) -> tuple[int, int] | None:
    """(earlier call, later call) when two kept calls returned outputs in the same memory,
    or (-1, call) when a call returned memory of `forbidden` (the staged inputs); None when
    every output is memory of its own. `kept`: (call, storage addresses of its non-empty
    outputs)."""
    owner: dict[int, int] = {address: -1 for address in forbidden}
    for call, addresses in kept:
        for address in set(addresses):
            earlier = owner.get(address)
            if earlier is not None:
                return earlier, call
            owner[address] = call
    return None
