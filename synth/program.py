"""A generated program: operators, tensor shapes, and its canonical source text.

`Program` is the library-facing form (the teacher and the learner read it): tensors are
numbered `tensor_N` in creation order, program inputs first (in `get_inputs()` order),
then one computed tensor per operator in program order; the outputs are the computed
tensors no operator consumes. `Program.source` prints the contract of the design
exactly (one operator per line, canonical keyword forms), and a `ProgramRecord` is the
JSON line `drtriton synth generate` writes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from synth.operators import REGISTRY, Params, numel

HEADER = "import torch\nimport torch.nn.functional as F\n"


def public_params(params: Params) -> Params:
    """Parameters that describe the program (internal solver choices start with `_`)."""
    return {k: v for k, v in params.items() if not k.startswith("_")}


@dataclass(frozen=True)
class Op:
    """One operator application: `tensor_{output} = op(tensor_{inputs...}, **params)`."""

    op: str
    inputs: tuple[int, ...]
    output: int
    params: Params = field(default_factory=dict)


@dataclass(frozen=True)
class Program:
    shapes: tuple[tuple[int, ...], ...]
    """Shape of tensor_N, for every N."""
    n_inputs: int
    nodes: tuple[Op, ...]

    @cached_property
    def outputs(self) -> tuple[int, ...]:
        consumed = {t for n in self.nodes for t in n.inputs}
        return tuple(n.output for n in self.nodes if n.output not in consumed)

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(n.op for n in self.nodes)

    @property
    def input_shapes(self) -> list[list[int]]:
        return [list(self.shapes[t]) for t in range(self.n_inputs)]

    @property
    def output_shapes(self) -> list[list[int]]:
        return [list(self.shapes[t]) for t in self.outputs]

    @property
    def flops(self) -> int:
        return sum(
            REGISTRY[n.op].flop_count(
                [self.shapes[t] for t in n.inputs], self.shapes[n.output], n.params
            )
            for n in self.nodes
        )

    @property
    def bytes(self) -> int:
        """Memory of all tensors of the program together (float32), the bounded quantity."""
        return 4 * sum(numel(s) for s in self.shapes)

    @property
    def bytes_moved(self) -> int:
        """Bytes an eager, one-kernel-per-operator run reads and writes."""
        return sum(
            REGISTRY[n.op].bytes_moved([self.shapes[t] for t in n.inputs], self.shapes[n.output])
            for n in self.nodes
        )

    @cached_property
    def source(self) -> str:
        return self.render()

    @cached_property
    def hash(self) -> str:
        """Canonical content hash: the source already fixes names, order and formatting."""
        return hashlib.sha256(self.source.encode()).hexdigest()

    def render(self, return_all: bool = False) -> str:
        """The program text. `return_all` returns every computed tensor instead of the
        outputs only (used to check each intermediate shape against the solver)."""
        lines = [HEADER, "def get_inputs():"]
        names = [f"tensor_{i}" for i in range(len(self.shapes))]
        for t in range(self.n_inputs):
            dims = ", ".join(str(d) for d in self.shapes[t])
            lines.append(f"    {names[t]} = torch.randn([{dims}], dtype=torch.float32)")
        lines.append(f"    return [{', '.join(names[: self.n_inputs])}]\n")
        lines.append(f"def fused_operator({', '.join(names[: self.n_inputs])}):")
        for n in self.nodes:
            op = REGISTRY[n.op]
            call = op.render(
                [names[t] for t in n.inputs], n.params, [self.shapes[t] for t in n.inputs]
            )
            lines.append(f"    {names[n.output]} = {call}")
        returned = [n.output for n in self.nodes] if return_all else self.outputs
        lines.append(f"    return [{', '.join(names[t] for t in returned)}]")
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "shapes": [list(s) for s in self.shapes],
            "n_inputs": self.n_inputs,
            "nodes": [
                {"op": n.op, "inputs": list(n.inputs), "output": n.output, "params": n.params}
                for n in self.nodes
            ],
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Program:
        nodes = tuple(
            Op(n["op"], tuple(n["inputs"]), n["output"], dict(n["params"])) for n in data["nodes"]
        )
        return Program(tuple(tuple(s) for s in data["shapes"]), data["n_inputs"], nodes)

    @staticmethod
    def assemble(
        inputs: Sequence[int],
        nodes: Sequence[tuple[str, Sequence[int], int, Params]],
        shapes: Sequence[Sequence[int]],
    ) -> Program:
        """Renumber tensors canonically (inputs first, then outputs in program order)."""
        order = [*inputs, *(out for _, _, out, _ in nodes)]
        new = {old: i for i, old in enumerate(order)}
        ops = tuple(
            Op(op, tuple(new[t] for t in ins), new[out], public_params(params))
            for op, ins, out, params in nodes
        )
        return Program(tuple(tuple(shapes[old]) for old in order), len(inputs), ops)


@dataclass(frozen=True)
class ProgramRecord:
    """One line of a generated JSONL file."""

    id: str
    level: int
    ops: list[str]
    source: str
    input_shapes: list[list[int]]
    output_shapes: list[list[int]]
    flops: int
    bytes: int
    profile: str
    seed: int
    index: int
    flops_floor: int
    """The FLOPs lower bound this program was solved under (the profile's, or lower)."""
    graph: dict[str, Any]
    """`Program.to_dict()`: shapes of every tensor and every operator with its params."""

    @staticmethod
    def of(
        program: Program, *, level: int, profile: str, seed: int, index: int, flops_floor: int
    ) -> ProgramRecord:
        return ProgramRecord(
            id=program.hash[:16],
            level=level,
            ops=list(program.ops),
            source=program.source,
            input_shapes=program.input_shapes,
            output_shapes=program.output_shapes,
            flops=program.flops,
            bytes=program.bytes,
            profile=profile,
            seed=seed,
            index=index,
            flops_floor=flops_floor,
            graph=program.to_dict(),
        )

    @property
    def program(self) -> Program:
        return Program.from_dict(self.graph)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))

    @staticmethod
    def from_json(line: str) -> ProgramRecord:
        return ProgramRecord(**json.loads(line))
