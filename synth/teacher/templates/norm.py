"""Normalisation without affine weights: layer_norm, group_norm, instance_norm, batch_norm.

Each operator normalises *groups* of elements with their own mean and biased variance
(eps inside the square root, like PyTorch): LayerNorm, GroupNorm and InstanceNorm a
contiguous row each (the last k dims; a group's channels and positions; one channel's
positions), BatchNorm in training mode a channel over the batch and positions, strided.
BatchNorm works on 2-D tiles, rows (batch element, position) by channels: where a
channel's runs of positions are short (an [N, C] input has runs of one element), a tile
holds BLOCK_C channels side by side so that each row's loads are contiguous; where the
runs are long, BLOCK_C is 1 and the runs are what is contiguous.

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
LONG_RUN = 8  # batch_norm positions per channel run that fill a 32-byte sector on their own
MAX_BLOCK_C = 64  # batch_norm channels side by side in a tile when runs are short


def _group_extent(module: Module, op: Op, rank: int) -> None:
    """Host variables `n_groups`, `group_len` (and batch_norm's strides) for this operator.

    For batch_norm a group is a block of BLOCK_C channels, its length the rows (batch
    element, position) they share.
    """
    x = module.shape(op.inputs[0])
    if op.kind == "batch_norm":
        module.host(
            f"n_batch, n_channels = {x}[0], {x}[1]",
            f"n_spatial = {dims_product(x, range(2, rank))}",
            f"BLOCK_C = 1 if n_spatial >= {LONG_RUN} else "
            f"min(triton.next_power_of_2(n_channels), {MAX_BLOCK_C})",
            "n_groups, group_len = triton.cdiv(n_channels, BLOCK_C), n_batch * n_spatial",
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


def _step_size(tiled: bool) -> str:
    """The constexpr count of a group's positions that one step of a sweep covers."""
    return "BLOCK_ROWS" if tiled else "BLOCK_SIZE"


def _segment(k: KernelBuilder, tiled: bool) -> None:
    """Declare the sizes; `group`, `start`, `end`: this program's segment of its group,
    and for a batch_norm tile its `channels` and `channel_mask`."""
    if tiled:
        k.scalar("group_len", "group_len")
    else:  # contiguous groups: a length the compiler sees as a multiple of VEC
        k.scalar("group_vecs", "group_len // VEC")
        k.constexpr("VEC", "VEC")
    k.scalar("segment_len", "segment_len")
    k.scalar("n_segments", "n_segments")
    if tiled:
        k.scalar("n_spatial", "n_spatial")
        k.scalar("n_channels", "n_channels")
        k.constexpr("BLOCK_ROWS", "BLOCK_ROWS")
        k.constexpr("BLOCK_C", "BLOCK_C")
    else:
        k.constexpr("BLOCK_SIZE", "BLOCK_SIZE")
    index_64 = k.constexpr("INDEX_64", "index_64")
    if not tiled:
        k.line("group_len = group_vecs * VEC  # groups start VEC-aligned: loads VEC wide")
    k.line("pid = tl.program_id(0)")
    with k.block(f"if {index_64}:"):
        k.line("pid = pid.to(tl.int64)")
    k.line(
        "group = pid // n_segments",
        "start = (pid % n_segments) * segment_len",
        "end = tl.minimum(start + segment_len, group_len)",
    )
    if tiled:
        k.line(
            "channels = group * BLOCK_C + tl.arange(0, BLOCK_C)",
            "channel_mask = channels < n_channels",
        )


def _step(k: KernelBuilder, tiled: bool) -> None:
    """Inside a sweep: `offsets` and `mask` of this step's elements."""
    if tiled:  # batch_norm: rows (batch element, position) by the tile's channels
        k.line(
            "j = first + tl.arange(0, BLOCK_ROWS)[:, None]  # rows within the group",
            "mask = (j < end) & channel_mask[None, :]",
            "offsets = ((j // n_spatial) * n_channels + channels[None, :]) * n_spatial "
            "+ j % n_spatial",
        )
    else:
        k.line(
            "j = first + tl.arange(0, BLOCK_SIZE)  # positions within the group",
            "mask = j < end",
            "offsets = group * group_len + j",
        )


def _moments(k: KernelBuilder, module: Module, group: Group, op: Op, tiled: bool) -> None:
    """Sweep the segment: `count`, `mean`, `m2` (sum of squared deviations) of its elements,
    per channel of the tile for batch_norm."""
    lanes = "(BLOCK_ROWS, BLOCK_C)" if tiled else "(BLOCK_SIZE,)"
    k.line(
        f"count = tl.zeros({lanes}, dtype=tl.float32)  # per lane (Welford)",
        f"mean = tl.zeros({lanes}, dtype=tl.float32)",
        f"m2 = tl.zeros({lanes}, dtype=tl.float32)",
    )
    with k.block(f"for first in range(start, end, {_step_size(tiled)}):"):
        _step(k, tiled)
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
    """Merge partial moments (per lane, or per segment) along axis 0 into `count`, `mean`,
    `m2`: scalars, or one per channel of a batch_norm tile."""
    k.line(
        f"total = tl.sum({counts}, axis=0)",
        f"overall = tl.sum({counts} * {means}, axis=0) / total",
        f"spread = {means} - overall",
        f"m2 = tl.sum({m2s} + {counts} * spread * spread, axis=0)",
        "count, mean = total, overall",
    )


def _moments_kernel(module: Module, group: Group, op: Op, tiled: bool) -> KernelBuilder:
    doc = (
        f"Moments of {op.kind}'s groups, one segment per program: count, mean and sum of "
        "squared deviations, merged by the normalising kernel."
    )
    k = module.kernel(kernel_label(group) + "_moments", doc)
    _segment(k, tiled)
    _moments(k, module, group, op, tiled)
    moments = k.pointer("moments")
    if tiled:  # a slot per (channel, segment)
        k.line("slot = (channels * n_segments + pid % n_segments) * 3")
        mask = ", mask=channel_mask"
    else:  # a slot per (group, segment)
        k.line("slot = pid * 3")
        mask = ""
    k.line(
        f"tl.store({moments} + slot, count{mask})",
        f"tl.store({moments} + slot + 1, mean{mask})",
        f"tl.store({moments} + slot + 2, m2{mask})",
    )
    return k


def _normalise_kernel(
    module: Module, group: Group, op: Op, tiled: bool, shape: str, rank: int
) -> KernelBuilder:
    doc = (
        f"{'; '.join(describe(o) for o in group_ops(group))}: each program normalises one "
        "segment of a group, with the group's statistics."
    )
    k = module.kernel(kernel_label(group), doc)
    _segment(k, tiled)
    k.constexpr("EPS", repr(float(op.params["eps"])))
    split = k.constexpr("SPLIT", "n_segments > 1")
    parts = k.constexpr("SEGMENTS_P2", "triton.next_power_of_2(n_segments)")
    with k.block(f"if {split}:  # other programs' moments: merge the group's segments"):
        moments = k.pointer("moments")
        if tiled:  # segments down, the tile's channels across
            k.line(
                f"part = tl.arange(0, {parts})[:, None]",
                "seg = channels[None, :] * n_segments + part",
                "valid = (part < n_segments) & channel_mask[None, :]",
            )
        else:
            k.line(
                f"part = tl.arange(0, {parts})",
                "seg = group * n_segments + part",
                "valid = part < n_segments",
            )
        k.line(
            f"counts = tl.load({moments} + seg * 3, mask=valid, other=0.0)",
            f"means = tl.load({moments} + seg * 3 + 1, mask=valid, other=0.0)",
            f"m2s = tl.load({moments} + seg * 3 + 2, mask=valid, other=0.0)",
        )
        _merge(k, "counts", "means", "m2s")
    with k.block("else:  # the whole group is this program's segment"):
        _moments(k, module, group, op, tiled)
    k.line("rstd = 1.0 / tl.sqrt(m2 / count + EPS)")
    with k.block(f"for first in range(start, end, {_step_size(tiled)}):"):
        _step(k, tiled)
        x = module.load_input(k, group, op.inputs[0], "offsets", "mask", "0.0")
        k.line(f"{op.out} = ({x} - mean) * rstd")
        Epilogue(module, k, group, Tile("offsets", "mask", shape, rank)).run([op.out])
    return k


def emit(module: Module, group: Group) -> None:
    op = group.anchor
    assert op is not None
    rank = len(module.plan.shapes[op.inputs[0]])
    shape = f"{op.out}_shape"
    tiled = op.kind == "batch_norm"
    step = _step_size(tiled)
    module.host(f"{shape} = {module.shape(op.inputs[0])}")
    module.allocate(group.stores, shape)
    _group_extent(module, op, rank)
    moments_kernel = _moments_kernel(module, group, op, tiled)
    normalise_kernel = _normalise_kernel(module, group, op, tiled, shape, rank)
    module.comment(
        "Split long groups into segments until the GPU has enough programs; a split group's "
        "segment moments go through `moments` to the normalising kernel."
    )
    lanes = f"{BLOCK_SIZE} // BLOCK_C" if tiled else str(BLOCK_SIZE)
    width = "n_groups * BLOCK_C" if tiled else "n_groups"  # groups' elements per position
    if not tiled:
        module.host(
            "VEC = 4 if group_len % 4 == 0 else 2 if group_len % 2 == 0 else 1  # elements per load"
        )
    module.host(
        f"{step} = min(triton.next_power_of_2(group_len), {lanes})",
        f"n_segments = max(1, min(triton.cdiv(group_len, {step}), "
        f"triton.cdiv({TARGET_PROGRAMS}, n_groups), {MAX_SEGMENTS}))",
        f"segment_len = triton.cdiv(triton.cdiv(group_len, n_segments), {step}) * {step}",
        "n_segments = triton.cdiv(group_len, segment_len)  # no empty segment",
        "grid = (n_groups * n_segments,)",
        f"index_64 = {width} * group_len + {BLOCK_SIZE} >= 2**31  # 32-bit offsets while they fit",
    )
    slots = "n_channels" if tiled else "n_groups"
    module.host(f"moment_rows = {slots} * n_segments if n_segments > 1 else 1")
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
