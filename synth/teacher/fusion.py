"""Decide which operators share a kernel.

A *group* is one Triton kernel. It has at most one *anchor* (matmul, reduction,
softmax, scan, normalisation, pooling, convolution), followed by pointwise and
gather operators evaluated on the anchor's output tile (an epilogue); a group
without an anchor is an elementwise kernel over one iteration shape.

Rules, applied in program order:

- A pointwise operator joins the group that produces its latest input when its
  output has that group's iteration shape and every other input is already in
  memory when the group launches (a program input, or stored by an earlier group).
  Otherwise it may join the latest elementwise group of the same shape whose
  launch all its inputs precede (horizontal fusion); otherwise it starts a group.
- Gather operators (cat, stack, a materialised transpose) read their inputs from
  memory at shifted coordinates, so none of their inputs may be computed in the
  same group.
- `transpose(x, -2, -1)` is a *view*: consumers that take strided operands
  (elementwise kernels, matmul) read `x` through swapped strides and no kernel
  runs for it. Other anchors, and the program's outputs, get it materialised.
- Tensors produced in a group are stored when a program output or read by
  another group; everything else stays in registers.
- Prologues: when an elementwise group exists only to feed an anchor input that the
  anchor reads at contiguous offsets (the input of a reduction, softmax, scan,
  normalisation or pooling, the image of a convolution, a matmul operand without
  broadcast batch dims), the anchor evaluates that group at its own loads instead,
  and the elementwise kernel and its intermediate tensor disappear.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .parse import Op, Program, Shape

GATHER_KINDS = frozenset({"cat", "stack", "transpose"})
STRIDED_ANCHORS = frozenset({"matmul"})  # families whose inputs may be transposed views
# Which inputs of each anchor family are read at contiguous offsets, where a prologue can run.
PROLOGUE_INPUTS = {
    "reduction": (0,),
    "softmax": (0,),
    "scan": (0,),
    "norm": (0,),
    "pool": (0,),
    "conv": (0,),
    "matmul": (0, 1),
}


@dataclass
class Group:
    """One kernel: an optional anchor and the elementwise operators fused after it."""

    index: int
    anchor: Op | None
    ops: list[Op]
    shape: Shape
    stores: list[str] = field(default_factory=list)
    # Elementwise groups evaluated at the anchor's loads instead of running on their own,
    # by the input tensor they compute.
    prologues: dict[str, Group] = field(default_factory=dict)

    @property
    def all_ops(self) -> list[Op]:
        return ([self.anchor] if self.anchor else []) + self.ops

    @property
    def produced(self) -> list[str]:
        return [op.out for op in self.all_ops]


@dataclass
class Plan:
    """Kernels in launch order, plus the transposes that stay views."""

    program: Program
    groups: list[Group]
    views: dict[str, str]  # view tensor -> the tensor (or view) it transposes
    shapes: dict[str, Shape]  # the program's shapes, plus those of materialised copies
    returns: list[str]  # the tensors `triton_fused_operator` returns, in order

    def base(self, name: str) -> str:
        """The materialised tensor whose memory `name` reads."""
        while name in self.views:
            name = self.views[name]
        return name

    @property
    def kernel_count(self) -> int:
        return len(self.groups)


def _is_pointwise(op: Op) -> bool:
    return op.family == "pointwise" or op.kind == "copy"


class _Planner:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.shapes = dict(program.shapes)
        self.groups: list[Group] = []
        self.producer: dict[str, int] = {}  # tensor -> index of the group computing it
        self.views: dict[str, str] = {}

    def base(self, name: str) -> str:
        while name in self.views:
            name = self.views[name]
        return name

    def ready_at(self, name: str) -> int:
        """Index of the group that must run before `name` can be read (-1: an input)."""
        return self.producer.get(self.base(name), -1)

    def can_join(self, group: Group, op: Op) -> bool:
        if group.shape != self.shapes[op.out]:
            return False
        if group.anchor is not None and op.kind in GATHER_KINDS:
            return False
        for name in op.inputs:
            in_group = name not in self.views and self.producer.get(name) == group.index
            if in_group:
                if not _is_pointwise(op):
                    return False
            elif self.ready_at(name) >= group.index:
                return False
        return True

    def new_group(self, anchor: Op | None, ops: list[Op], shape: Shape) -> Group:
        group = Group(index=len(self.groups), anchor=anchor, ops=ops, shape=shape)
        self.groups.append(group)
        for op in group.all_ops:
            self.producer[op.out] = group.index
        return group

    def add_elementwise(self, op: Op) -> None:
        latest = max((self.ready_at(name) for name in op.inputs), default=-1)
        candidates = []
        if latest >= 0 and _is_pointwise(op):
            candidates.append(self.groups[latest])
        candidates += [g for g in reversed(self.groups) if g.anchor is None and g.index > latest]
        for group in candidates:
            if self.can_join(group, op):
                group.ops.append(op)
                self.producer[op.out] = group.index
                return
        self.new_group(None, [op], self.shapes[op.out])

    def copy(self, name: str, out: str) -> str:
        """Copy a view (or an input) into fresh memory named `out`, in an elementwise kernel."""
        self.shapes[out] = self.shapes[name]
        self.add_elementwise(Op(out=out, kind="copy", inputs=(name,), params={}))
        return out

    def run(self) -> Plan:
        outputs = set(self.program.outputs)
        for op in self.program.ops:
            if op.kind == "transpose" and op.out not in outputs:
                self.views[op.out] = op.inputs[0]
                continue
            if _is_pointwise(op) or op.kind in GATHER_KINDS:
                self.add_elementwise(op)
                continue
            if op.family not in STRIDED_ANCHORS and any(n in self.views for n in op.inputs):
                inputs = tuple(
                    self.copy(n, f"{n}_contiguous") if n in self.views else n for n in op.inputs
                )
                op = replace(op, inputs=inputs)
            self.new_group(op, [], self.shapes[op.out])
        # Outputs never alias inputs: a returned input is copied first.
        returns = [
            self.copy(name, f"{name}_copy") if name in self.program.inputs else name
            for name in self.program.outputs
        ]
        self.assign_stores(returns)
        self.fuse_prologues(returns)
        return Plan(self.program, self.groups, self.views, self.shapes, returns)

    def readers(self) -> dict[str, set[int]]:
        """Groups reading each materialised tensor (directly or through a view)."""
        readers: dict[str, set[int]] = {}
        for group in self.groups:
            for op in group.all_ops:
                for name in op.inputs:
                    readers.setdefault(self.base(name), set()).add(group.index)
        return readers

    def fuse_prologues(self, returns: list[str]) -> None:
        """Move an elementwise group into the anchor that is the only reader of its output."""
        readers = self.readers()
        fused: set[int] = set()
        for group in self.groups:
            anchor = group.anchor
            if anchor is None:
                continue
            for position in PROLOGUE_INPUTS.get(anchor.family, ()):
                name = anchor.inputs[position]
                source = self.producer.get(name)
                if name in self.views or source is None or source in fused:
                    continue
                if (
                    anchor.family == "matmul"
                    and self.shapes[name][:-2] != self.shapes[anchor.out][:-2]
                ):
                    continue  # a broadcast batch operand is read through strides
                producer = self.groups[source]
                if (
                    producer.anchor is None
                    and producer.stores == [name]
                    and name not in returns
                    and readers.get(name) == {group.index}
                    and all(name not in op.inputs for op in group.ops)
                ):
                    group.prologues[name] = producer
                    fused.add(source)
        self.groups = [g for g in self.groups if g.index not in fused]

    def assign_stores(self, returns: list[str]) -> None:
        readers = self.readers()
        outputs = set(returns)
        for group in self.groups:
            group.stores = [
                name
                for name in group.produced
                if name in outputs or readers.get(name, set()) - {group.index}
            ]


def plan(program: Program) -> Plan:
    """Group the program's operators into kernels (see the module docstring)."""
    return _Planner(program).run()
