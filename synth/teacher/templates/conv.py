"""conv1d/2d/3d and conv_transpose1d/2d/3d as implicit GEMMs on `tl.dot`.

Per group, rows are output positions (batch x spatial) and columns the group's output
channels. The reduction loops over kernel offsets, and for each over BLOCK_K input
channels, so the input positions (and their bounds checks) are computed once per
kernel offset and reused for every channel block. For a convolution, output o reads
input i = o * stride - padding + k * dilation; for a transposed convolution, o
receives i when o + padding - k * dilation = i * stride. Reads outside the input are
masked to zero, which is also the padding. A strided transposed convolution splits its
rows by output phase (o mod stride, `_phase_rows`): only 1 in stride kernel offsets per
dim reaches a phase, and a program skips the others whole.

The reduction (input channels x kernel volume: 17k terms for some 3-D transposed
convolutions) is accumulated as in `matmul`: each step's `tl.dot` on its own, added to
the running sum with Kahan compensation, not one FMA chain through all of K. With at
most 64 channel pairs a group (a depthwise convolution has one), `tl.dot`'s 16 x 16
minimum tile would be mostly padding: the kernel sums the products itself (`DOT`).
"""

from __future__ import annotations

import contextlib

from ..codegen import (
    Epilogue,
    KernelBuilder,
    Module,
    Tile,
    compensated_add,
    compensated_start,
    describe,
    dims_product,
    dot_num_warps,
    group_ops,
    kernel_label,
    shape_tuple,
)
from ..fusion import Group
from .matmul import DOT_PRECISION

AXES = {1: ["l"], 2: ["h", "w"], 3: ["d", "h", "w"]}


def _unravel(k: KernelBuilder, flat: str, names: list[str], sizes: list[str], temp: str) -> None:
    """Row-major coordinates `names` of the flat index `flat` over `sizes` (`temp`: scratch name)."""
    rest = flat
    for i in range(len(names) - 1, 0, -1):
        k.line(f"{names[i]} = {rest} % {sizes[i]}")
        k.line(f"{temp if i > 1 else names[0]} = {rest} // {sizes[i]}")
        rest = temp
    if len(names) == 1:
        k.line(f"{names[0]} = {flat}")


def _phase_rows(k: KernelBuilder, axes: list[str]) -> None:
    """Rows of a strided transposed convolution: one output phase a program.

    Output o = q * STRIDE + r, r in [0, STRIDE) per dim: for a fixed r, whether kernel
    offset k reaches o is the same for every q, so a program's row tile holds one
    phase and skips the offsets that miss it (1 in STRIDE per dim is kept). In
    `program_id(0)` the phase varies fastest: neighbouring programs take the same
    block of q in every phase, and read the same inputs. Every phase lays its q out
    over cdiv(out, STRIDE) per dim, the largest phase's extent (known to the host, and
    never 0); outputs past the end (all of a phase with r >= out) are masked.
    """
    k.line(
        f"phase = pid_m % ({' * '.join('STRIDE' for _ in axes)})  # r, flattened",
        f"block_m = pid_m // ({' * '.join('STRIDE' for _ in axes)})",
    )
    _unravel(k, "phase", [f"r{a}" for a in axes], ["STRIDE"] * len(axes), "phase_rest")
    k.line(
        *(f"span_{a} = tl.cdiv(out_{a}, STRIDE)  # q per dim" for a in axes),
        "# Rows: output positions of this phase, as (batch, q coordinates).",
        "m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        f"phase_positions = {' * '.join(f'span_{a}' for a in axes)}",
        "batch = m // phase_positions",
        "position = m % phase_positions",
    )
    _unravel(k, "position", [f"q{a}" for a in axes], [f"span_{a}" for a in axes], "position_rest")
    k.line(*(f"o{a} = q{a} * STRIDE + r{a}" for a in axes))
    k.line(
        "m_mask = (m < n_batch * phase_positions)" + "".join(f" & (o{a} < out_{a})" for a in axes),
    )
    spatial = f"o{axes[0]}"
    for a in axes[1:]:
        spatial = (
            f"({spatial}) * out_{a} + o{a}" if "+" in spatial else f"{spatial} * out_{a} + o{a}"
        )
    k.line(f"position = {spatial}  # spatial index in the output")


def emit(module: Module, group: Group) -> None:
    op = group.anchor
    assert op is not None
    p = op.params
    nd, transposed = p["nd"], op.kind.startswith("conv_transpose")
    phased = transposed and p["stride"] > 1  # rows split by output phase (`_phase_rows`)
    axes = AXES[nd]
    x_name = op.inputs[0]
    x, w = module.shape(x_name), module.tensor(op.inputs[1])  # x: host shape (may be a prologue)
    rank = len(module.plan.shapes[x_name])
    shape = f"{op.out}_shape"
    constants = "stride, padding, dilation, groups"
    values = f"{p['stride']}, {p['padding']}, {p['dilation']}, {p['groups']}"
    if transposed:
        constants, values = constants + ", output_padding", values + f", {p['output_padding']}"
    in_sizes = ", ".join(f"in_{a}" for a in axes) + ("," if nd == 1 else "")
    kernel_sizes = ", ".join(f"kernel_{a}" for a in axes) + ("," if nd == 1 else "")
    module.host(
        f"{constants} = {values}",
        f"n_batch = {dims_product(x, range(rank - nd - 1))}",
        f"in_channels = {x}[-{nd + 1}]",
        f"{in_sizes} = {x}[-{nd}:]",
        f"{kernel_sizes} = {w}.shape[-{nd}:]",
    )
    if transposed:
        module.host(f"out_channels = {w}.shape[1] * groups")
        module.host(
            *(
                f"out_{a} = (in_{a} - 1) * stride - 2 * padding + dilation * (kernel_{a} - 1)"
                " + output_padding + 1"
                for a in axes
            )
        )
    else:
        module.host(f"out_channels = {w}.shape[0]")
        module.host(
            *(
                f"out_{a} = (in_{a} + 2 * padding - dilation * (kernel_{a} - 1) - 1) // stride + 1"
                for a in axes
            )
        )
    batch_dims = [f"{x}[{d}]" for d in range(rank - nd - 1)]
    module.host(
        f"{shape} = {shape_tuple(batch_dims + ['out_channels'] + [f'out_{a}' for a in axes])}"
    )
    module.allocate(group.stores, shape)

    doc = (
        f"{'; '.join(describe(o) for o in group_ops(group))}: implicit GEMM, a BLOCK_M (output "
        "positions) x BLOCK_N (output channels of one group) tile per program."
    )
    k = module.kernel(kernel_label(group), doc)
    w_ptr = k.pointer(w)
    for name in ["n_batch", "in_channels", "out_channels"] + [f"in_{a}" for a in axes]:
        k.scalar(name, name)
    for name in [f"out_{a}" for a in axes] + [f"kernel_{a}" for a in axes]:
        k.scalar(name, name)
    for name in ("STRIDE", "PADDING", "DILATION", "GROUPS"):
        k.constexpr(name, name.lower())
    for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        k.constexpr(name, name)
    k.constexpr("DOT", "use_dot")
    out_spatial = " * ".join(f"out_{a}" for a in axes)
    in_spatial = " * ".join(f"in_{a}" for a in axes)
    kernel_volume = " * ".join(f"kernel_{a}" for a in axes)
    k.line(
        "pid_m = tl.program_id(0)",
        "pid_n = tl.program_id(1)",
        "group = tl.program_id(2)",
        "in_per_group = in_channels // GROUPS",
        "out_per_group = out_channels // GROUPS",
        f"out_positions = {out_spatial}",
        f"in_positions = {in_spatial}",
        f"kernel_volume = {kernel_volume}",
    )
    if phased:
        _phase_rows(k, axes)
    else:
        k.line(
            "# Rows: output positions, as (batch, spatial coordinates).",
            "m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
            "m_mask = m < n_batch * out_positions",
            "batch = m // out_positions",
            "position = m % out_positions",
        )
        _unravel(
            k, "position", [f"o{a}" for a in axes], [f"out_{a}" for a in axes], "position_rest"
        )
    k.line(
        "# Columns: output channels of this group.",
        "co = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        "co_mask = co < out_per_group",
        "channel_base = group * in_per_group  # first input channel of the group",
    )
    compensated_start(k, "(BLOCK_M, BLOCK_N)")
    relation = (
        "o = i * stride - padding + k * dilation"
        if transposed
        else "i = o * stride - padding + k * dilation"
    )
    with contextlib.ExitStack() as loop:
        loop.enter_context(k.block(f"for kernel_offset in range(kernel_volume):  # {relation}"))
        _unravel(
            k,
            "kernel_offset",
            [f"k{a}" for a in axes],
            [f"kernel_{a}" for a in axes],
            "offset_rest",
        )
        if phased:
            k.line(
                "# The offset reaches this phase's outputs only if STRIDE divides"
                " r + PADDING - k * DILATION;",
                "# then i = q + (r + PADDING - k * DILATION) / STRIDE. Others: no loads, no dot.",
                *(f"tap_{a} = r{a} + PADDING - k{a} * DILATION" for a in axes),
            )
            contributes = " & ".join(f"(tap_{a} % STRIDE == 0)" for a in axes)
            loop.enter_context(k.block(f"if {contributes}:"))
        valid = "m_mask"
        for a in axes:
            if not transposed:
                k.line(f"x{a} = o{a} * STRIDE - PADDING + k{a} * DILATION")
            elif phased:
                k.line(f"x{a} = q{a} + tap_{a} // STRIDE  # an exact division")
            else:
                k.line(f"x{a} = o{a} + PADDING - k{a} * DILATION")
            valid += f" & (x{a} >= 0) & (x{a} < in_{a})"
        spatial = f"x{axes[0]}"
        for a in axes[1:]:
            spatial = (
                f"({spatial}) * in_{a} + x{a}" if "+" in spatial else f"{spatial} * in_{a} + x{a}"
            )
        k.line(
            f"valid = {valid}",
            f"x_offsets = (batch * in_channels + channel_base) * in_positions + {spatial}",
        )
        with k.block("for c_start in range(0, in_per_group, BLOCK_K):"):
            k.line(
                "ci = c_start + tl.arange(0, BLOCK_K)  # input channels within the group",
                "ci_mask = ci < in_per_group",
                "a_offsets = x_offsets[:, None] + ci[None, :] * in_positions",
                "a_mask = valid[:, None] & ci_mask[None, :]",
            )
            module.load_input(k, group, x_name, "a_offsets", "a_mask", "0.0", register="a")
            if transposed:
                k.line(
                    "# weight[in_channel, out_channel within the group, kernel offset]",
                    "w_offsets = ((channel_base + ci[:, None]) * out_per_group + co[None, :]) "
                    "* kernel_volume + kernel_offset",
                )
            else:
                k.line(
                    "# weight[out_channel, in_channel within the group, kernel offset]",
                    "w_offsets = ((group * out_per_group + co[None, :]) * in_per_group + ci[:, None]) "
                    "* kernel_volume + kernel_offset",
                )
            k.line(
                f"b = tl.load({w_ptr} + w_offsets, mask=ci_mask[:, None] & co_mask[None, :], other=0.0)"
            )
            with k.block("if DOT:"):
                k.line(f'product = tl.dot(a, b, input_precision="{DOT_PRECISION}")')
            with k.block("else:  # few channels a group: the products, summed in registers"):
                k.line("product = tl.sum(a[:, :, None] * b[None, :, :], axis=1)")
            compensated_add(k, "product")
    k.line(
        f"{op.out} = acc - carry",
        "channel = group * out_per_group + co",
        "out_offsets = (batch[:, None] * out_channels + channel[None, :]) * out_positions + position[:, None]",
        "mask = m_mask[:, None] & co_mask[None, :]",
    )
    tile = Tile("out_offsets", "mask", shape, len(module.plan.shapes[op.out]))
    Epilogue(module, k, group, tile).run([op.out])
    if phased:
        phase_spatial = " * ".join(f"triton.cdiv(out_{a}, stride)" for a in axes)
        module.host(f"n_rows = n_batch * {phase_spatial}  # rows of one output phase")
    else:
        module.host(f"n_rows = n_batch * {out_spatial}")
    row_blocks = "triton.cdiv(n_rows, BLOCK_M)" + (f" * stride**{nd}" if phased else "")
    # 4 warps up to 128 x 16 tiles: with 8, their SASS took 208 registers a thread (8
    # resident warps a multiprocessor, against 12 with 4). tl.dot takes 16 x 16 tiles at
    # least: with few channels a group (depthwise, many groups) nearly all of one would be
    # padding, so there the kernel multiplies and sums a [BLOCK_M, BLOCK_K, BLOCK_N] tile
    # of exactly the group's channels instead (a float32 dot runs on the same FMA units).
    module.host(
        "channels_in, channels_out = in_channels // groups, out_channels // groups  # a group's",
        "use_dot = triton.next_power_of_2(channels_in) * triton.next_power_of_2(channels_out) > 64",
        "BLOCK_M = max(16, min(128, triton.next_power_of_2(n_rows)))",
        "BLOCK_N = max(16, min(64, triton.next_power_of_2(channels_out))) if use_dot "
        "else triton.next_power_of_2(channels_out)",
        "BLOCK_K = max(16, min(32, triton.next_power_of_2(channels_in))) if use_dot "
        "else triton.next_power_of_2(channels_in)",
        f"grid = ({row_blocks}, triton.cdiv(out_channels // groups, BLOCK_N), groups)",
        f"num_warps = {dot_num_warps(4096)}",
    )
    k.options["num_warps"] = "num_warps"
    module.body.extend(k.launch("grid"))
