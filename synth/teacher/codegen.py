"""Building blocks for emitted modules: kernels, the host wrapper, fused epilogues.

Templates describe a kernel by appending body lines and declaring the arguments it
needs (each together with the host expression that supplies it), so the signature
and the launch can never disagree. The `Epilogue` evaluates pointwise and gather
operators on any *tile* (a block of elements of the group's iteration space, given
by contiguous offsets and a mask), which is how elementwise chains and epilogue
fusion share one code path across all templates.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from .fusion import GATHER_KINDS, Group, Plan
from .parse import Op
from .templates.pointwise import helpers_for, pointwise_lines

INDENT = "    "


def wrap_call(head: str, args: list[str], tail: str, indent: str, width: int = 100) -> list[str]:
    """`head(args)tail` on one line, or one argument line per group when too long."""
    one_line = f"{indent}{head}({', '.join(args)}){tail}"
    if len(one_line) <= width:
        return [one_line]
    lines = [f"{indent}{head}("]
    current = ""
    for arg in args:
        piece = f"{arg},"
        if current and len(indent) + 4 + len(current) + 1 + len(piece) > width:
            lines.append(f"{indent}    {current}")
            current = piece
        else:
            current = f"{current} {piece}" if current else piece
    if current:
        lines.append(f"{indent}    {current}")
    lines.append(f"{indent}){tail}")
    return lines


def _split_args(text: str) -> list[str]:
    """Split a call's argument text at top-level commas."""
    args, depth, current = [], 0, ""
    for char in text:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            args.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        args.append(current.strip())
    return args


def wrap_statement(text: str, indent: str, width: int = 100) -> list[str]:
    """One kernel statement; a too-long `tl.load` / `tl.store` call gets one argument per line."""
    if len(indent) + len(text) <= width or not text.endswith(")"):
        return [indent + text]
    match = re.search(r"tl\.(load|store)\(", text)
    if match is None:
        return [indent + text]
    head, inner = text[: match.end() - 1], text[match.end() : -1]
    args = _split_args(inner)
    return [f"{indent}{head}("] + [f"{indent}    {arg}," for arg in args] + [f"{indent})"]


@dataclass
class _ArgGroup:
    params: list[str]
    host: str  # one host expression, starred when it supplies several parameters
    kind: str  # "pointer", "scalar" or "constexpr"


class KernelBuilder:
    """One `@triton.jit` kernel: its arguments (with host values) and body."""

    def __init__(self, name: str, doc: str) -> None:
        self.name = name
        self.doc = doc
        self._args: list[_ArgGroup] = []
        self._params: set[str] = set()
        self.lines: list[str] = []
        self._depth = 1
        self.options: dict[str, str] = {}  # launch options (num_warps), name -> host expression

    # -- arguments ------------------------------------------------------------------
    def _add(self, params: list[str], host: str, kind: str) -> list[str]:
        """Declare parameters filled from `host`, once; a name clash gets a numbered suffix."""
        candidate, index = params, 2
        while any(p in self._params for p in candidate):
            if any(arg.params == candidate and arg.host == host for arg in self._args):
                return candidate
            candidate = [f"{p}_{index}" for p in params]
            index += 1
        params = candidate
        self._params.update(params)
        self._args.append(_ArgGroup(params, host, kind))
        return params

    def pointer(self, tensor: str) -> str:
        """The pointer argument for a host tensor variable."""
        return self._add([f"{tensor}_ptr"], tensor, "pointer")[0]

    def scalar(self, param: str, host: str) -> str:
        return self._add([param], host, "scalar")[0]

    def scalars(self, params: list[str], host: str) -> list[str]:
        """Several scalar parameters filled from one starred host sequence."""
        return self._add(params, f"*{host}", "scalar") if params else []

    def constexpr(self, param: str, host: str) -> str:
        return self._add([param], host, "constexpr")[0]

    # -- body -----------------------------------------------------------------------
    def line(self, *texts: str) -> None:
        for text in texts:
            indent = INDENT * self._depth
            self.lines.extend(wrap_statement(text, indent) if text else [""])

    @contextmanager
    def block(self, header: str) -> Iterator[None]:
        self.line(header)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    # -- output ---------------------------------------------------------------------
    def _ordered(self) -> list[_ArgGroup]:
        order = {"pointer": 0, "scalar": 1, "constexpr": 2}
        return sorted(self._args, key=lambda a: order[a.kind])

    def source(self) -> str:
        params = []
        for arg in self._ordered():
            suffix = ": tl.constexpr" if arg.kind == "constexpr" else ""
            params += [p + suffix for p in arg.params]
        head = wrap_call(f"def {self.name}", params, ":", "")
        doc = textwrap.wrap(self.doc, 92)
        doc[0] = '"""' + doc[0]
        if len(doc) == 1:
            doc[0] += '"""'
        else:
            doc.append('"""')
        return "\n".join(["@triton.jit", *head, *(INDENT + line for line in doc), *self.lines])

    def launch(self, grid: str, indent: str = INDENT) -> list[str]:
        args = []
        for arg in self._ordered():
            if arg.kind == "constexpr":
                args.append(f"{arg.params[0]}={arg.host}")
            else:
                args.append(arg.host)
        args += [f"{name}={host}" for name, host in self.options.items()]
        return wrap_call(f"{self.name}[{grid}]", args, "", indent)


@dataclass
class Tile:
    """A block of elements of a group's (contiguous) iteration space.

    `offsets` are the elements' flat indices (also their offsets in any contiguous
    tensor of the iteration shape), `shape` the host expression of that shape, and
    `coords` optional per-dimension index expressions (derived from `offsets` when
    absent). A `merged` tile's coords index the dims the host merged at run time
    (`templates.elementwise.merge_dims`), not the iteration shape's: every operand is
    then read through its merged strides, host variable `{tensor}_strides`.
    """

    offsets: str
    mask: str
    shape: str
    rank: int
    coords: list[str] | None = None
    merged: bool = False


@dataclass
class Module:
    """The emitted candidate: kernels, helper device functions and the host wrapper."""

    plan: Plan
    kernels: list[KernelBuilder] = field(default_factory=list)
    helpers: dict[str, str] = field(default_factory=dict)  # name -> source
    body: list[str] = field(default_factory=list)  # host wrapper lines
    defined: set[str] = field(default_factory=set)  # host variables that exist
    shapes: dict[str, str] = field(default_factory=dict)  # host shape of register-only tensors
    needs_math: bool = False
    _names: set[str] = field(default_factory=set)

    def kernel(self, base: str, doc: str) -> KernelBuilder:
        name = f"{base}_kernel"
        index = 2
        while name in self._names:
            name = f"{base}_{index}_kernel"
            index += 1
        self._names.add(name)
        builder = KernelBuilder(name, doc)
        self.kernels.append(builder)
        return builder

    def host(self, *lines: str) -> None:
        self.body.extend(INDENT + line if line else "" for line in lines)

    def comment(self, text: str) -> None:
        """A host comment, wrapped to the line width."""
        self.host(*(f"# {line}" for line in textwrap.wrap(text, 94)))

    @property
    def device(self) -> str:
        return f"{self.plan.program.inputs[0]}.device"

    def tensor(self, name: str) -> str:
        """The host variable for a tensor a kernel reads, defining views on first use."""
        if name in self.defined:
            return name
        source = self.plan.views.get(name)
        if source is None:
            raise AssertionError(f"{name} is read before it is computed")
        self.host(f"{name} = {self.tensor(source)}.transpose(-2, -1)  # a view, read by strides")
        self.defined.add(name)
        return name

    def shape(self, name: str) -> str:
        """Host expression for a tensor's shape, also for one that only lives in registers."""
        return self.shapes.get(name) or f"{self.tensor(name)}.shape"

    def load_input(
        self,
        k: KernelBuilder,
        group: Group,
        name: str,
        offsets: str,
        mask: str,
        other: str,
        register: str = "x",
    ) -> str:
        """Emit `register = name[offsets]` for an anchor's input; return the register.

        When `name` is computed by a prologue it is never stored: the prologue's
        elementwise operators are evaluated right here at the offsets instead, and
        masked lanes get `other` explicitly (a prologue of padding is not padding).
        """
        prologue = group.prologues.get(name)
        if prologue is None:
            ptr = k.pointer(self.tensor(name))
            k.line(f"{register} = tl.load({ptr} + {offsets}, mask={mask}, other={other})")
            return register
        tile = Tile(offsets, mask, self.shape(name), len(self.plan.shapes[name]))
        Epilogue(self, k, prologue, tile, store=False).run([])
        k.line(f"{register} = tl.where({mask}, {name}, {other})")
        return register

    def allocate(self, names: list[str], shape: str) -> None:
        for name in names:
            args = [shape, f"device={self.device}", "dtype=torch.float32"]
            self.body.extend(wrap_call(f"{name} = torch.empty", args, "", INDENT))
            self.defined.add(name)

    def is_contiguous(self, name: str) -> bool:
        return name not in self.plan.views


def compensated_start(k: KernelBuilder, shape: str) -> None:
    """Zero `acc` and its Kahan `carry` (see `compensated_add`) for a tile of `shape`."""
    k.line(
        f"acc = tl.zeros({shape}, dtype=tl.float32)  # per-lane partial sums",
        f"carry = tl.zeros({shape}, dtype=tl.float32)  # what each lane's rounding lost (Kahan)",
    )


def compensated_add(k: KernelBuilder, term: str) -> None:
    """`acc += term`, Kahan-compensated: the sum is `acc - carry` after the last one.

    A lane that adds thousands of terms in a row in plain float32 drifts past PyTorch's
    own error (PyTorch's reductions split theirs); compensated, its error stays about
    one rounding, for three more additions per term. A `tl.dot` as `term` keeps its
    own accumulation to one block: Triton folds `acc + tl.dot(a, b)` into the dot's
    chain, but not the subtraction it meets here.
    """
    k.line(
        f"term = {term} - carry",
        "summed = acc + term",
        "carry = (summed - acc) - term",
        "acc = summed",
    )


def dot_num_warps(min_outputs: int) -> str:
    """Host expression for the warps of a `tl.dot` kernel whose sum is compensated: 8 for
    BLOCK_M x BLOCK_N tiles of `min_outputs` elements or more, else 4.

    The product of each K block, the running sum and its carry are three float32
    registers per output element. With 4 warps, the SASS (sm_90) of a 128 x 64 conv tile
    spilled (about 170 local stores) and a 64 x 64 matmul tile took 252 registers a
    thread, half the resident warps of the uncompensated kernel; with 8, neither.
    """
    return f"8 if BLOCK_M * BLOCK_N >= {min_outputs} else 4"


def dims_product(shape: str, dims: range | list[int]) -> str:
    """Host expression for the product of some sizes of a shape expression (1 when none)."""
    dims = list(dims)
    return " * ".join(f"{shape}[{d}]" for d in dims) if dims else "1"


def shape_tuple(items: list[str]) -> str:
    if len(items) == 1:
        return f"({items[0]},)"
    return f"({', '.join(items)})"


class Epilogue:
    """Evaluates a group's pointwise/gather operators on one tile, storing what is needed."""

    def __init__(
        self, module: Module, kernel: KernelBuilder, group: Group, tile: Tile, store: bool = True
    ) -> None:
        self.module = module
        self.kernel = kernel
        self.group = group
        self.tile = tile
        self.stores = set(group.stores) if store else set()
        self.registers: set[str] = set()
        self._coords = tile.coords
        self.operands: list[str] = []  # host tensors a merged tile reads, in load order

    def coords(self) -> list[str]:
        """Per-dimension indices of the tile's elements, computed once when first needed."""
        if self.tile.merged:
            raise AssertionError("a merged tile has no coordinates of the iteration shape")
        if self._coords is not None:
            return self._coords
        k, tile = self.kernel, self.tile
        names = [f"idx{d}" for d in range(tile.rank)]
        if tile.rank == 1:
            self._coords = [tile.offsets]
            return self._coords
        if tile.rank > 0:
            # Another tile of this kernel (a prologue's) may have claimed `size{d}` for its
            # own shape: the names come back suffixed then, and only those may be used.
            sizes = ["", *k.scalars([f"size{d}" for d in range(1, tile.rank)], f"{tile.shape}[1:]")]
            k.line("# Coordinates of each element in the iteration space (row-major).")
            rest = tile.offsets
            for d in range(tile.rank - 1, 0, -1):
                k.line(f"{names[d]} = {rest} % {sizes[d]}")
                if d > 1:
                    k.line(f"idx_rest = {rest} // {sizes[d]}")
                    rest = "idx_rest"
                else:
                    k.line(f"{names[0]} = {rest} // {sizes[d]}")
        self._coords = names
        return names

    def load_strided(
        self, register: str, tensor: str, strides_of: str, coords: list[str], mask: str
    ) -> None:
        """`register = tensor[coords]`, addressed with the strides of the view `strides_of`."""
        k = self.kernel
        strides = k.scalars(
            [f"{tensor}_stride{d}" for d in range(len(coords))], f"{strides_of}.stride()"
        )
        address = " + ".join(
            [k.pointer(tensor)] + [f"{c} * {s}" for c, s in zip(coords, strides, strict=True)]
        )
        k.line(f"{register} = tl.load({address}, mask={mask}, other=0.0)")

    def load_merged(self, register: str, tensor: str) -> None:
        """`register = tensor[coords]` on a merged tile, through the strides merged with it."""
        k, coords = self.kernel, self.tile.coords or []
        strides = k.scalars(
            [f"{tensor}_stride{d}" for d in range(len(coords))], f"{tensor}_strides"
        )
        address = " + ".join(
            [k.pointer(tensor)] + [f"{c} * {s}" for c, s in zip(coords, strides, strict=True)]
        )
        k.line(f"{register} = tl.load({address}, mask={self.tile.mask})")
        self.operands.append(tensor)

    def value(self, name: str) -> str:
        """The register holding `name` on this tile, loading it from memory if needed."""
        if name in self.registers:
            return name
        tensor = self.module.tensor(name)
        tile = self.tile
        if tile.merged:
            if self.module.plan.shapes[name]:
                self.load_merged(name, tensor)
            else:  # 0-d: one value whatever the other shapes, no strides to merge
                self.kernel.line(f"{name} = tl.load({self.kernel.pointer(tensor)})  # a 0-d tensor")
            self.registers.add(name)
            return name
        shape = self.module.plan.shapes[name]
        contiguous = self.module.is_contiguous(name)
        if contiguous and shape == self.group.shape:
            ptr = self.kernel.pointer(tensor)
            self.kernel.line(f"{name} = tl.load({ptr} + {tile.offsets}, mask={tile.mask})")
        elif contiguous and math.prod(shape) == 1:
            self.kernel.line(
                f"{name} = tl.load({self.kernel.pointer(tensor)})  # a broadcast scalar"
            )
        elif contiguous and _is_suffix(shape, self.group.shape):
            # Broadcast along leading dims only: the operand repeats every numel elements.
            ptr = self.kernel.pointer(tensor)
            numel = self.kernel.scalar(f"{tensor}_numel", f"{tensor}.numel()")
            self.kernel.line(
                f"{name} = tl.load({ptr} + {tile.offsets} % {numel}, mask={tile.mask})"
            )
        else:  # broadcast inside, or strided: read through the strides of its broadcast view
            view = f"{tensor}.expand({tile.shape})"
            self.load_strided(name, tensor, view, self.coords(), tile.mask)
        self.registers.add(name)
        return name

    def gather(self, op: Op) -> None:
        """cat / stack / transpose: read the inputs at remapped coordinates."""
        coords, mask = self.coords(), self.tile.mask
        k = self.kernel
        if op.kind == "transpose":
            source = self.module.tensor(op.inputs[0])
            self.load_strided(op.out, source, f"{source}.transpose(-2, -1)", coords, mask)
            return
        first, second = (self.module.tensor(name) for name in op.inputs)
        dim = op.params["dim"]
        if op.kind == "cat":
            split = k.scalar(f"{op.out}_split", f"{first}.shape[{dim}]")
            k.line(f"in_first = {coords[dim]} < {split}")
            first_coords = coords
            second_coords = coords[:dim] + [f"({coords[dim]} - {split})"] + coords[dim + 1 :]
        else:  # stack: the new dimension picks the input
            k.line(f"in_first = {coords[dim]} == 0")
            first_coords = second_coords = coords[:dim] + coords[dim + 1 :]
        self.load_strided(f"{op.out}_first", first, first, first_coords, f"{mask} & in_first")
        self.load_strided(f"{op.out}_second", second, second, second_coords, f"{mask} & ~in_first")
        k.line(f"{op.out} = tl.where(in_first, {op.out}_first, {op.out}_second)")

    def store(self, name: str) -> None:
        ptr = self.kernel.pointer(name)
        self.kernel.line(f"tl.store({ptr} + {self.tile.offsets}, {name}, mask={self.tile.mask})")

    def run(self, computed: list[str]) -> None:
        """Emit the group's operators after the anchor; `computed` are already in registers."""
        self.registers.update(computed)
        for name in computed:
            if name in self.stores:
                self.store(name)
        for op in self.group.ops:
            if op.kind in GATHER_KINDS:
                self.gather(op)
            else:
                args = [self.value(name) for name in op.inputs]
                self.kernel.line(*pointwise_lines(op, args, self.coords))
                self.module.helpers.update(helpers_for(op.kind))
            self.registers.add(op.out)
            if op.out in self.stores:
                self.store(op.out)


def _is_suffix(shape: tuple[int, ...], full: tuple[int, ...]) -> bool:
    """Whether `shape` broadcasts to `full` by adding leading dims only."""
    trimmed = list(shape)
    while trimmed and trimmed[0] == 1:
        trimmed.pop(0)
    return tuple(full[len(full) - len(trimmed) :]) == tuple(trimmed) if trimmed else False


def describe(op: Op) -> str:
    """`out = kind(inputs)` (numbers in their places), for kernel docstrings."""
    return f"{op.out} = {op.kind}({', '.join(op.operands(op.inputs))})"


def group_ops(group: Group) -> list[Op]:
    """The operators one kernel computes, prologues included, in program order."""
    prologues = sorted(group.prologues.values(), key=lambda g: g.index)
    return [op for g in prologues for op in g.all_ops] + group.all_ops


def kernel_label(group: Group) -> str:
    """A readable kernel name from the operators it computes."""
    ops = ([group.anchor] if group.anchor else []) + group_ops(group)  # the anchor names it first
    kinds = [op.kind for op in ops if op.kind != "copy"] or ["copy"]
    unique = list(dict.fromkeys(kinds))
    label = "_".join(unique[:3])
    return label + "_fused" if len(unique) > 3 else label
