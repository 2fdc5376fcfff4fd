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
from dataclasses import dataclass

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
from ..parse import Op
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


def _flatten(names: list[str], sizes: list[str]) -> str:
    """The row-major flat index of coordinates `names` over `sizes` (`_unravel` reversed)."""
    flat = names[0]
    for name, size in zip(names[1:], sizes[1:], strict=True):
        flat = f"({flat}) * {size} + {name}" if "+" in flat else f"{flat} * {size} + {name}"
    return flat


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
    spatial = _flatten([f"o{a}" for a in axes], [f"out_{a}" for a in axes])
    k.line(f"position = {spatial}  # spatial index in the output")


@dataclass(frozen=True)
class _Conv:
    """The facts about one convolution that every part of its code depends on."""

    axes: list[str]
    """Spatial axis names, outermost first (`AXES`)."""
    transposed: bool
    phased: bool
    """A strided transposed convolution: rows split by output phase (`_phase_rows`)."""

    @property
    def nd(self) -> int:
        return len(self.axes)

    def names(self, prefix: str) -> list[str]:
        """One name per spatial axis: `names("in_")` is `["in_h", "in_w"]` in 2-D."""
        return [f"{prefix}{a}" for a in self.axes]

    def product(self, prefix: str) -> str:
        """The product of the per-axis names with `prefix` (`in_h * in_w`)."""
        return " * ".join(self.names(prefix))


def emit(module: Module, group: Group) -> None:
    """Emit the host sizes, the implicit-GEMM kernel and its launch for a conv group."""
    op = group.anchor
    assert op is not None
    transposed = op.kind.startswith("conv_transpose")
    conv = _Conv(AXES[op.params["nd"]], transposed, transposed and op.params["stride"] > 1)
    x_name = op.inputs[0]
    # Host names, in this order: either may define a view on first use (a host line).
    x, w = module.shape(x_name), module.tensor(op.inputs[1])  # x: may be a prologue's
    shape = f"{op.out}_shape"
    _host_sizes(module, op, conv, x, w, shape)
    module.allocate(group.stores, shape)

    doc = (
        f"{'; '.join(describe(o) for o in group_ops(group))}: implicit GEMM, a BLOCK_M (output "
        "positions) x BLOCK_N (output channels of one group) tile per program."
    )
    k = module.kernel(kernel_label(group), doc)
    w_ptr = _declare_arguments(k, conv, w)
    _tile_indices(k, conv)
    compensated_start(k, "(BLOCK_M, BLOCK_N)")
    _reduce_over_kernel(module, k, group, conv, x_name, w_ptr)
    _store(module, k, group, op.out, shape)
    _host_launch(module, k, conv)


def _host_sizes(module: Module, op: Op, conv: _Conv, x: str, w: str, shape: str) -> None:
    """Host lines binding the parameters, the input, kernel and output sizes, and `shape`.

    The sizes are read from the tensors at run time; only the parameters are literals.
    """
    p, nd = op.params, conv.nd
    rank = len(module.plan.shapes[op.inputs[0]])
    constants = "stride, padding, dilation, groups"
    values = f"{p['stride']}, {p['padding']}, {p['dilation']}, {p['groups']}"
    if conv.transposed:
        constants, values = constants + ", output_padding", values + f", {p['output_padding']}"
    trailing = "," if nd == 1 else ""  # a 1-tuple target
    module.host(
        f"{constants} = {values}",
        f"n_batch = {dims_product(x, range(rank - nd - 1))}",
        f"in_channels = {x}[-{nd + 1}]",
        f"{', '.join(conv.names('in_'))}{trailing} = {x}[-{nd}:]",
        f"{', '.join(conv.names('kernel_'))}{trailing} = {w}.shape[-{nd}:]",
    )
    _host_output_sizes(module, conv, w)
    batch_dims = [f"{x}[{d}]" for d in range(rank - nd - 1)]
    module.host(f"{shape} = {shape_tuple(batch_dims + ['out_channels'] + conv.names('out_'))}")


def _host_output_sizes(module: Module, conv: _Conv, w: str) -> None:
    """Host lines for `out_channels` and each `out_<axis>`, by PyTorch's formulas."""
    if conv.transposed:
        module.host(f"out_channels = {w}.shape[1] * groups")
        module.host(
            *(
                f"out_{a} = (in_{a} - 1) * stride - 2 * padding + dilation * (kernel_{a} - 1)"
                " + output_padding + 1"
                for a in conv.axes
            )
        )
    else:
        module.host(f"out_channels = {w}.shape[0]")
        module.host(
            *(
                f"out_{a} = (in_{a} + 2 * padding - dilation * (kernel_{a} - 1) - 1) // stride + 1"
                for a in conv.axes
            )
        )


def _declare_arguments(k: KernelBuilder, conv: _Conv, w: str) -> str:
    """Declare the weight pointer, the size scalars and the constexprs; return the pointer.

    Declaration order is argument order (within each kind), so it is kept fixed.
    """
    w_ptr = k.pointer(w)
    for name in ["n_batch", "in_channels", "out_channels"] + conv.names("in_"):
        k.scalar(name, name)
    for name in conv.names("out_") + conv.names("kernel_"):
        k.scalar(name, name)
    for name in ("STRIDE", "PADDING", "DILATION", "GROUPS"):
        k.constexpr(name, name.lower())
    for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        k.constexpr(name, name)
    k.constexpr("DOT", "use_dot")
    return w_ptr


def _tile_indices(k: KernelBuilder, conv: _Conv) -> None:
    """The program's rows (output positions), columns (a group's output channels) and group."""
    k.line(
        "pid_m = tl.program_id(0)",
        "pid_n = tl.program_id(1)",
        "group = tl.program_id(2)",
        "in_per_group = in_channels // GROUPS",
        "out_per_group = out_channels // GROUPS",
        f"out_positions = {conv.product('out_')}",
        f"in_positions = {conv.product('in_')}",
        f"kernel_volume = {conv.product('kernel_')}",
    )
    if conv.phased:
        _phase_rows(k, conv.axes)
    else:
        k.line(
            "# Rows: output positions, as (batch, spatial coordinates).",
            "m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
            "m_mask = m < n_batch * out_positions",
            "batch = m // out_positions",
            "position = m % out_positions",
        )
        _unravel(k, "position", conv.names("o"), conv.names("out_"), "position_rest")
    k.line(
        "# Columns: output channels of this group.",
        "co = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        "co_mask = co < out_per_group",
        "channel_base = group * in_per_group  # first input channel of the group",
    )


def _reduce_over_kernel(
    module: Module, k: KernelBuilder, group: Group, conv: _Conv, x_name: str, w_ptr: str
) -> None:
    """The reduction: a loop over kernel offsets, each over blocks of input channels.

    Input positions and their bounds are computed once per offset and reused for every
    channel block; a phased program skips the offsets that miss its phase whole.
    """
    relation = (
        "o = i * stride - padding + k * dilation"
        if conv.transposed
        else "i = o * stride - padding + k * dilation"
    )
    with contextlib.ExitStack() as loop:
        loop.enter_context(k.block(f"for kernel_offset in range(kernel_volume):  # {relation}"))
        _unravel(k, "kernel_offset", conv.names("k"), conv.names("kernel_"), "offset_rest")
        if conv.phased:
            loop.enter_context(_phase_taps(k, conv.axes))
        _input_positions(k, conv)
        with k.block("for c_start in range(0, in_per_group, BLOCK_K):"):
            _channel_block(module, k, group, conv, x_name, w_ptr)


def _phase_taps(k: KernelBuilder, axes: list[str]) -> contextlib.AbstractContextManager[None]:
    """Open the `if` that keeps only the kernel offsets reaching this program's phase."""
    k.line(
        "# The offset reaches this phase's outputs only if STRIDE divides"
        " r + PADDING - k * DILATION;",
        "# then i = q + (r + PADDING - k * DILATION) / STRIDE. Others: no loads, no dot.",
        *(f"tap_{a} = r{a} + PADDING - k{a} * DILATION" for a in axes),
    )
    contributes = " & ".join(f"(tap_{a} % STRIDE == 0)" for a in axes)
    return k.block(f"if {contributes}:")


def _input_positions(k: KernelBuilder, conv: _Conv) -> None:
    """Per row, the input position this kernel offset reads (`valid`: inside the input)."""
    valid = "m_mask"
    for a in conv.axes:
        if not conv.transposed:
            k.line(f"x{a} = o{a} * STRIDE - PADDING + k{a} * DILATION")
        elif conv.phased:
            k.line(f"x{a} = q{a} + tap_{a} // STRIDE  # an exact division")
        else:
            k.line(f"x{a} = o{a} + PADDING - k{a} * DILATION")
        valid += f" & (x{a} >= 0) & (x{a} < in_{a})"
    spatial = _flatten(conv.names("x"), conv.names("in_"))
    k.line(
        f"valid = {valid}",
        f"x_offsets = (batch * in_channels + channel_base) * in_positions + {spatial}",
    )


def _channel_block(
    module: Module, k: KernelBuilder, group: Group, conv: _Conv, x_name: str, w_ptr: str
) -> None:
    """One BLOCK_K step over input channels: load both tiles, multiply, add compensated."""
    k.line(
        "ci = c_start + tl.arange(0, BLOCK_K)  # input channels within the group",
        "ci_mask = ci < in_per_group",
        "a_offsets = x_offsets[:, None] + ci[None, :] * in_positions",
        "a_mask = valid[:, None] & ci_mask[None, :]",
    )
    module.load_input(k, group, x_name, "a_offsets", "a_mask", "0.0", register="a")
    if conv.transposed:
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
    k.line(f"b = tl.load({w_ptr} + w_offsets, mask=ci_mask[:, None] & co_mask[None, :], other=0.0)")
    with k.block("if DOT:"):
        k.line(f'product = tl.dot(a, b, input_precision="{DOT_PRECISION}")')
    with k.block("else:  # few channels a group: the products, summed in registers"):
        k.line("product = tl.sum(a[:, :, None] * b[None, :, :], axis=1)")
    compensated_add(k, "product")


def _store(module: Module, k: KernelBuilder, group: Group, out: str, shape: str) -> None:
    """The compensated sum as `out`, run through the group's epilogue and stored."""
    k.line(
        f"{out} = acc - carry",
        "channel = group * out_per_group + co",
        "out_offsets = (batch[:, None] * out_channels + channel[None, :]) * out_positions + position[:, None]",
        "mask = m_mask[:, None] & co_mask[None, :]",
    )
    tile = Tile("out_offsets", "mask", shape, len(module.plan.shapes[out]))
    Epilogue(module, k, group, tile).run([out])


def _host_launch(module: Module, k: KernelBuilder, conv: _Conv) -> None:
    """Host lines choosing the tiles, `tl.dot` or not, the grid and warps; then the launch."""
    if conv.phased:
        phase_spatial = " * ".join(f"triton.cdiv(out_{a}, stride)" for a in conv.axes)
        module.host(f"n_rows = n_batch * {phase_spatial}  # rows of one output phase")
    else:
        module.host(f"n_rows = n_batch * {conv.product('out_')}")
    row_blocks = "triton.cdiv(n_rows, BLOCK_M)" + (f" * stride**{conv.nd}" if conv.phased else "")
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
