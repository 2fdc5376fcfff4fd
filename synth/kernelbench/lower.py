"""Walk an exported graph and write the functional program, one operator per line.

Each ATen call the outputs need is written the best way that works, tried in order:
a rewrite of a composite operator into registry operators (`rewrites.py`: linear as
transpose + matmul + add, a conv's bias as an add, a norm's affine weights as mul +
add, a reduction over several dims as one per dim), the call as a registry operator
(`registry.py`), or the call as plain PyTorch (`fragments.py`). A way works when its
lines run on the example values and give what the graph gave there; otherwise its
lines are rolled back and the next way is tried. A random operator (dropout with p > 0
in training mode) makes the Model non-deterministic: that is a reason, not a line.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch.fx import Node

from synth.kernelbench import rewrites
from synth.kernelbench.check import close
from synth.kernelbench.fragments import AtenCall, UnprintableCall, bind, spellings
from synth.kernelbench.graph import ExportedGraph
from synth.kernelbench.program import LineError, ProgramBuilder, Value, refs
from synth.kernelbench.registry import registry_line
from synth.kernelbench.rewrites import Decline


class LoweringError(Exception):
    """The graph cannot be written as a functional program (the message says why)."""


@dataclass
class Lowered:
    """The rewritten program and what the rewrite found."""

    source: str
    param_inputs: dict[str, str]
    """Program input name -> the Model state it stands for (`fc.weight`)."""
    ops: list[str]
    """Per line, the registry operator, or `aten.<op>` for a line kept as PyTorch."""
    unmapped_ops: list[str] = field(default_factory=list)
    """The ATen operators kept as PyTorch, each once, in order of first use."""
    param_feeds: list[tuple[str, tuple[int, ...] | None]] = field(default_factory=list)
    """Per parameter input, in order: the Model state and the shape it enters at (None:
    its own shape)."""


class Lowering:
    """One rewrite of one exported graph, on the example values of one run of it."""

    def __init__(self, graph: ExportedGraph, trace: dict[Node, Any]) -> None:
        self.graph = graph
        self.trace = trace
        self.builder = ProgramBuilder()
        self.values: dict[Node, Value] = {}
        self._state: dict[str, tuple[str, tuple[int, ...] | None, int]] = {}
        """Input ref -> (Model state name, the shape it enters at or None, graph order)."""
        self._reshaped: dict[tuple[str, tuple[int, ...]], Value] = {}
        self._order = {node: i for i, node in enumerate(graph.nodes())}
        for entry in graph.inputs:
            if entry.kind == "user":
                self.values[entry.node] = self.builder.add_input(trace[entry.node], param=False)

    # -- values ------------------------------------------------------------------------
    def value(self, node: Node) -> Value:
        """The program value of a graph node (a Model state input on first use)."""
        if node in self.values:
            return self.values[node]
        entry = next((e for e in self.graph.inputs if e.node is node), None)
        if entry is None:
            raise LoweringError(f"`{node.name}` is used before it is written")
        value = self.builder.add_input(self.trace[node], param=True)
        self.values[node] = value
        self._state[value.ref] = (entry.target, None, self._order[node])
        return value

    def reshaped_input(self, value: Value, shape: list[int]) -> Value | None:
        """A Model-state input taken in another shape (a bias as [C, 1, 1]) as an input of
        that shape, so no reshape line stands between the operators; None when `value`
        is not a state input."""
        if value.ref not in self._state:
            return None
        target, own_shape, order = self._state[value.ref]
        if own_shape is not None:
            return None
        key = (target, tuple(shape))
        if key not in self._reshaped:
            reshaped = self.builder.add_input(value.example.reshape(shape), param=True)
            self._state[reshaped.ref] = (target, tuple(shape), order)
            self._reshaped[key] = reshaped
        return self._reshaped[key]

    def ref(self, node: Node) -> str:
        return self.value(node).ref

    # -- writing lines ---------------------------------------------------------------
    def registry(self, call: AtenCall, op: Any = None) -> Value:
        """The call as a registry operator, or `Decline`."""
        found = registry_line(call, self.value, op)
        if found is None:
            raise Decline(f"{call.label} is not a registry operator here")
        return self.builder.emit(found[1], found[0].name, mapped=True)

    def line(self, expr: str, label: str, *, mapped: bool) -> Value:
        return self.builder.emit(expr, label, mapped=mapped)

    def fragment(self, call: AtenCall, expected: Any, index: int | None) -> Value:
        """The call as plain PyTorch: the first spelling that computes `expected`."""
        anchor = self._anchor(call)
        last: Exception | None = None
        for expr in spellings(call, self.ref, anchor, index):
            mark = self.builder.mark()
            try:
                value = self.builder.emit(expr, call.label, mapped=False)
            except LineError as err:
                last = err
                continue
            if close(value.example, expected):
                return value
            self.builder.rollback(mark)
        raise LoweringError(f"cannot write {call.label} as PyTorch ({last or 'values differ'})")

    def _anchor(self, call: AtenCall) -> str | None:
        """A tensor whose device a device argument can name."""
        for value in call.args.values():
            items = value if isinstance(value, list | tuple) else [value]
            for item in items:
                if isinstance(item, Node):
                    return self.ref(item)
        return self.builder.inputs[0].ref if self.builder.inputs else None

    # -- the walk ----------------------------------------------------------------------
    def lower_node(self, node: Node, source: Node, index: int | None) -> Value:
        call = bind(source)
        expected = self.trace[node]
        rewrites.refuse_random(call)
        attempts: list[Callable[[], Value]] = []
        rewrite = rewrites.REWRITES.get(call.packet)
        if rewrite is not None:
            attempts.append(lambda: rewrite(self, call, index))
        if index is None or index == 0:
            attempts.append(lambda: self.registry(call))
        for attempt in attempts:
            mark = self.builder.mark()
            try:
                value = attempt()
            except (Decline, LineError, UnprintableCall):
                self.builder.rollback(mark)
                continue
            if close(value.example, expected):
                return value
            self.builder.rollback(mark)
        return self.fragment(call, expected, index)

    def run(self) -> Lowered:
        needed = _needed(self.graph.outputs)
        for node in self.graph.nodes():
            if node not in needed or node.op != "call_function":
                continue
            try:
                if node.target is operator.getitem:
                    source, index = node.args
                    self.values[node] = self.lower_node(node, source, index)
                elif not isinstance(node.meta.get("val"), list | tuple):
                    self.values[node] = self.lower_node(node, node, None)
                # a tuple is written where its elements are taken
            except UnprintableCall as err:
                raise LoweringError(f"cannot write `{node.name}`: {err}") from None
        outputs = [self._output(out) for out in self.graph.outputs]
        return self._finish(outputs)

    def _output(self, out: Any) -> Value:
        if not isinstance(out, Node):
            raise LoweringError(f"the Model returns {out!r} ({type(out).__name__}), not a tensor")
        value = self.value(out)
        if value.is_input:  # fused_operator returns computed tensors
            value = self.line(f"torch.clone({value.ref})", "aten.clone", mapped=False)
        return value

    def _finish(self, outputs: Sequence[Value]) -> Lowered:
        self.builder.prune(list(outputs))
        used = {ref for line in self.builder.lines for ref in refs(line.expr)}
        used |= {value.ref for value in outputs}
        by_ref = {value.ref: value for value in self.builder.inputs}
        states = sorted(
            (ref for ref in self._state if ref in used),
            key=lambda ref: (self._state[ref][2], self._state[ref][1] is not None),
        )
        users = [v for v in self.builder.inputs if not v.param_only]
        self.builder.inputs = users + [by_ref[ref] for ref in states]
        source, names = self.builder.source(list(outputs))
        lines = self.builder.ordered_lines()
        unmapped = [line.label for line in lines if not line.mapped]
        return Lowered(
            source=source,
            param_inputs={names[ref]: self._state[ref][0] for ref in states},
            ops=[line.label for line in lines],
            unmapped_ops=list(dict.fromkeys(unmapped)),
            param_feeds=[self._state[ref][:2] for ref in states],
        )


def _needed(outputs: Sequence[Any]) -> set[Node]:
    """Every node the user outputs depend on."""
    seen: set[Node] = set()
    stack = [out for out in outputs if isinstance(out, Node)]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        stack.extend(node.all_input_nodes)
    return seen


def lower(graph: ExportedGraph, trace: dict[Node, Any]) -> Lowered:
    """The functional program of `graph`; raises `LoweringError` with the reason."""
    try:
        return Lowering(graph, trace).run()
    except rewrites.RandomOperator as err:
        raise LoweringError(str(err)) from None
