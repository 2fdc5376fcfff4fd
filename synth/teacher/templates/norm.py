"""Normalisation without affine weights: layer_norm, group_norm, instance_norm, batch_norm.

Each operator normalises *groups* of elements with their own mean and biased variance
(eps inside the square root, like PyTorch): LayerNorm, GroupNorm and InstanceNorm a
contiguous row each (the last k dims; a group's channels and positions; one channel's
positions), BatchNorm in training mode a channel over the batch and positions, strided.

A program handles one *segment* of a group: it accumulates the segment's count, mean and
sum of squared deviations per lane (Welford), merges its lanes (Chan et al.), then
normalises the segment. A group short enough, or numerous enough to fill the GPU, is one
segment and one program: two sweeps over it, one kernel. Few long groups (a layer_norm
over a whole tensor, a channel of batch_norm) are split so that every SM has work: a
first kernel writes each segment's moments, the second merges its group's and
normalises; this second kernel is unavoidable there (nothing synchronises programs).
"""

from __future__ import annotations

from ..codegen import (
    INDENT,
    Epilogue,
    KernelBuilder,
    Module,
    Tile,
    describe,
    dims_product,
    group_ops,
    kernel_label,
    wrap_call,
)
from ..fusion import Group
from ..parse import Op

BLOCK_SIZE = 1024  # elements per step of a segment sweep
TARGET_PROGRAMS = 1024  # split groups until about this many programs run (several per SM)
MAX_SEGMENTS = 1024  # segments per group: the second kernel merges them in one step


def _group_extent(module: Module, op: Op, rank: int) -> None:
    """Host variables `n_groups`, `group_len` (and batch_norm's strides) for this operator."""
    x = module.shape(op.inputs[0])
    if op.kind == "batch_norm":
        module.host(
            f"n_batch, n_channels = {x}[0], {x}[1]",
            f"n_spatial = {dims_product(x, range(2, rank))}",
            "n_groups, group_len = n_channels, n_batch * n_spatial",
        )
        return
    if op.kind == "layer_norm":
        first = rank - op.params["n_dims"]
        rows, length = dims_product(x, range(first)), dims_product(x, range(first, rank))
    elif op.kind == "instance_norm":
        rows, length = dims_product(x, range(2)), dims_product(x, range(2, rank))
    else:  # group_norm: a group's channels are contiguous
        groups = op.params["num_groups"]
        rows = f"{x}[0] * {groups}"
        length = f"({x}[1] // {groups}) * {dims_product(x, range(2, rank))}"
    module.host(f"n_groups, group_len = {rows}, {length}")


def _segment(k: KernelBuilder, strided: bool) -> None:
    """Declare the sizes; `group`, `start`, `end`: this program's segment of its group."""
    k.scalar("group_len", "group_len")
    k.scalar("segment_len", "segment_len")
    k.scalar("n_segments", "n_segments")
    if strided:
        k.scalar("n_spatial", "n_spatial")
        k.scalar("n_channels", "n_channels")
    k.constexpr("BLOCK_SIZE", "BLOCK_SIZE")
    index_64 = k.constexpr("INDEX_64", "index_64")
    k.line("pid = tl.program_id(0)")
    with k.block(f"if {index_64}:"):
        k.line("pid = pid.to(tl.int64)")
    k.line(
        "group = pid // n_segments",
        "start = (pid % n_segments) * segment_len",
        "end = tl.minimum(start + segment_len, group_len)",
    )


def _step(k: KernelBuilder, strided: bool) -> None:
    """Inside a sweep: `offsets` and `mask` of this step's elements."""
    k.line("j = first + tl.arange(0, BLOCK_SIZE)  # positions within the group", "mask = j < end")
    if strided:  # batch_norm: the channel's positions, one contiguous run per batch element
        k.line("offsets = ((j // n_spatial) * n_channels + group) * n_spatial + j % n_spatial")
    else:
        k.line("offsets = group * group_len + j")


def _moments(k: KernelBuilder, module: Module, group: Group, op: Op, strided: bool) -> None:
    """Sweep the segment: `count`, `mean`, `m2` (sum of squared deviations) of its elements."""
    k.line(
        "count = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)  # per lane (Welford)",
        "mean = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)",
        "m2 = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)",
    )
    with k.block("for first in range(start, end, BLOCK_SIZE):"):
        _step(k, strided)
        x = module.load_input(k, group, op.inputs[0], "offsets", "mask", "0.0")
        k.line(
            "seen = count + mask.to(tl.float32)",
            f"delta = tl.where(mask, {x} - mean, 0.0)",
            "mean += delta / tl.maximum(seen, 1.0)",
            f"m2 += delta * tl.where(mask, {x} - mean, 0.0)",
            "count = seen",
        )
    _merge(k, "count", "mean", "m2")


def _merge(k: KernelBuilder, counts: str, means: str, m2s: str) -> None:
    """Merge partial moments (per lane, or per segment) into scalars `count`, `mean`, `m2`."""
    k.line(
        f"total = tl.sum({counts}, axis=0)",
        f"overall = tl.sum({counts} * {means}, axis=0) / total",
        f"spread = {means} - overall",
        f"m2 = tl.sum({m2s} + {counts} * spread * spread, axis=0)",
        "count, mean = total, overall",
    )


def _moments_kernel(module: Module, group: Group, op: Op, strided: bool) -> KernelBuilder:
    doc = (
        f"Moments of {op.kind}'s groups, one segment per program: count, mean and sum of "
        "squared deviations, merged by the normalising kernel."
    )
    k = module.kernel(kernel_label(group) + "_moments", doc)
    _segment(k, strided)
    _moments(k, module, group, op, strided)
    moments = k.pointer("moments")
    k.line(
        f"tl.store({moments} + pid * 3, count)",
        f"tl.store({moments} + pid * 3 + 1, mean)",
        f"tl.store({moments} + pid * 3 + 2, m2)",
    )
    return k


def _normalise_kernel(
    module: Module, group: Group, op: Op, strided: bool, shape: str, rank: int
) -> KernelBuilder:
    doc = (
        f"{'; '.join(describe(o) for o in group_ops(group))}: each program normalises one "
        "segment of a group, with the group's statistics."
    )
    k = module.kernel(kernel_label(group), doc)
    _segment(k, strided)
    k.constexpr("EPS", repr(float(op.params["eps"])))
    split = k.constexpr("SPLIT", "n_segments > 1")
    parts = k.constexpr("SEGMENTS_P2", "triton.next_power_of_2(n_segments)")
    with k.block(f"if {split}:  # other programs' moments: merge the group's segments"):
        moments = k.pointer("moments")
        k.line(
            f"part = tl.arange(0, {parts})",
            "seg = group * n_segments + part",
            "valid = part < n_segments",
            f"counts = tl.load({moments} + seg * 3, mask=valid, other=0.0)",
            f"means = tl.load({moments} + seg * 3 + 1, mask=valid, other=0.0)",
            f"m2s = tl.load({moments} + seg * 3 + 2, mask=valid, other=0.0)",
        )
        _merge(k, "counts", "means", "m2s")
    with k.block("else:  # the whole group is this program's segment"):
        _moments(k, module, group, op, strided)
    k.line("rstd = 1.0 / tl.sqrt(m2 / count + EPS)")
    with k.block("for first in range(start, end, BLOCK_SIZE):"):
        _step(k, strided)
        x = module.load_input(k, group, op.inputs[0], "offsets", "mask", "0.0")
        k.line(f"{op.out} = ({x} - mean) * rstd")
        Epilogue(module, k, group, Tile("offsets", "mask", shape, rank)).run([op.out])
    return k


def emit(module: Module, group: Group) -> None:
    op = group.anchor
    assert op is not None
    rank = len(module.plan.shapes[op.inputs[0]])
    shape = f"{op.out}_shape"
    strided = op.kind == "batch_norm"
    module.host(f"{shape} = {module.shape(op.inputs[0])}")
    module.allocate(group.stores, shape)
    _group_extent(module, op, rank)
    moments_kernel = _moments_kernel(module, group, op, strided)
    normalise_kernel = _normalise_kernel(module, group, op, strided, shape, rank)
    module.comment(
        "Split long groups into segments until the GPU has enough programs; a split group's "
        "segment moments go through `moments` to the normalising kernel."
    )
    module.host(
        f"BLOCK_SIZE = min(triton.next_power_of_2(group_len), {BLOCK_SIZE})",
        "n_segments = max(1, min(triton.cdiv(group_len, BLOCK_SIZE), "
        f"triton.cdiv({TARGET_PROGRAMS}, n_groups), {MAX_SEGMENTS}))",
        "segment_len = triton.cdiv(triton.cdiv(group_len, n_segments), BLOCK_SIZE) * BLOCK_SIZE",
        "n_segments = triton.cdiv(group_len, segment_len)  # no empty segment",
        "grid = (n_groups * n_segments,)",
        "index_64 = n_groups * group_len + BLOCK_SIZE >= 2**31  # 32-bit offsets while they fit",
    )
    module.host("moment_rows = n_groups * n_segments if n_segments > 1 else 1")
    module.body.extend(
        wrap_call(
            "moments = torch.empty",
            ["(moment_rows, 3)", f"device={module.device}", "dtype=torch.float32"],
            "",
            INDENT,
        )
    )
    module.host("if n_segments > 1:")
    module.body.extend(moments_kernel.launch("grid", indent=INDENT * 2))
    module.body.extend(normalise_kernel.launch("grid"))
