"""Export a Model to an ATen graph and run that graph once on example values.

`torch.export.export` traces the Model (as constructed: training mode, as KernelBench
runs it) into ATen operators; `run_decompositions({})` then makes the graph functional
(no in-place ops, batch norm's running-statistics updates become separate outputs)
without decomposing composite operators such as `linear`, `conv2d` or `layer_norm`,
which keeps them close to the registry's operators. Only the user outputs matter for
the rewrite: mutated buffers are side effects the functional format does not have.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx import GraphModule, Interpreter, Node


class ExportFailure(Exception):
    """torch.export could not trace the Model (the message says why)."""


_KINDS = {
    InputKind.USER_INPUT: "user",
    InputKind.PARAMETER: "parameter",
    InputKind.BUFFER: "buffer",
    InputKind.CONSTANT_TENSOR: "constant",
}


@dataclass(frozen=True)
class GraphInput:
    """One placeholder of the exported graph: a user input or a piece of Model state."""

    node: Node
    kind: str
    """'user', 'parameter', 'buffer' or 'constant'."""
    target: str
    """The state's qualified name (`fc.weight`), or `input{i}` for the i-th user input."""


@dataclass
class ExportedGraph:
    """The functional ATen graph of a Model and what its placeholders stand for."""

    module: GraphModule
    inputs: list[GraphInput]
    outputs: list[Any]
    """The user outputs, flattened in the Model's output order (nodes or constants)."""
    constants: dict[str, Any]
    """Lifted tensor constants by name."""

    def nodes(self) -> Iterator[Node]:
        return iter(self.module.graph.nodes)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def export_graph(model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> ExportedGraph:
    """Trace `model(*inputs)`; raises `ExportFailure` with torch's reason."""
    try:
        with _quiet():
            program = torch.export.export(model, tuple(inputs)).run_decompositions({})
    except Exception as err:  # noqa: BLE001 - every tracing failure becomes a reason
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ExportFailure(f"torch.export failed: {type(err).__name__}: {first}") from None
    signature = program.graph_signature
    placeholders = [n for n in program.graph_module.graph.nodes if n.op == "placeholder"]
    graph_inputs: list[GraphInput] = []
    user_index = 0
    for node, spec in zip(placeholders, signature.input_specs, strict=True):
        kind = _KINDS.get(spec.kind)
        if kind is None:
            raise ExportFailure(f"unsupported graph input kind {spec.kind.name}")
        if kind == "user":
            target = f"input{user_index}"
            user_index += 1
        else:
            target = str(spec.target)
        graph_inputs.append(GraphInput(node, kind, target))
    output_node = next(n for n in program.graph_module.graph.nodes if n.op == "output")
    flat = list(output_node.args[0])
    outputs = [
        value
        for value, spec in zip(flat, signature.output_specs, strict=True)
        if spec.kind == OutputKind.USER_OUTPUT
    ]
    return ExportedGraph(program.graph_module, graph_inputs, outputs, dict(program.constants))


def trace_values(
    graph: ExportedGraph, user_inputs: Sequence[torch.Tensor], state: Mapping[str, torch.Tensor]
) -> dict[Node, Any]:
    """The value of every node when the graph runs on `user_inputs`, with `state` (by
    qualified name) for parameters and buffers."""
    args: list[Any] = []
    users = iter(user_inputs)
    for entry in graph.inputs:
        if entry.kind == "user":
            args.append(next(users))
        elif entry.kind == "constant":
            args.append(graph.constants[entry.target])
        else:
            args.append(state[entry.target])
    recorder = Interpreter(graph.module, garbage_collect_values=False)
    with torch.no_grad(), _quiet():
        recorder.run(*args)
    return dict(recorder.env)
