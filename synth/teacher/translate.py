"""Problem source in, candidate module out: parse, plan kernels, emit each from its template."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .codegen import Module, describe, group_ops
from .fusion import Group, plan
from .parse import parse_program
from .templates import conv, elementwise, matmul, norm, pool, reduction, scan, softmax

TEMPLATES: dict[str | None, Callable[[Module, Group], None]] = {
    None: elementwise.emit,
    "matmul": matmul.emit,
    "reduction": reduction.emit,
    "softmax": softmax.emit,
    "scan": scan.emit,
    "norm": norm.emit,
    "pool": pool.emit,
    "conv": conv.emit,
}


@dataclass(frozen=True)
class Translation:
    """A candidate module and what it contains."""

    code: str
    kernel_count: int  # `@triton.jit` kernels (1 when the whole program fused into one)
    operators: tuple[str, ...]  # operator kinds, in program order
    kernels: tuple[tuple[str, ...], ...]  # the operators each kernel computes


def render(module: Module) -> str:
    program = module.plan.program
    parts = ["import torch\nimport triton\nimport triton.language as tl"]
    if module.needs_math:
        parts[0] = "import math\n\n" + parts[0]
    parts += list(module.helpers.values())
    parts += [kernel.source() for kernel in module.kernels]
    head = f"def triton_fused_operator({', '.join(program.inputs)}):"
    parts.append("\n".join([head, *module.body]))
    return "\n\n\n".join(parts) + "\n"


def translate(source: str) -> Translation:
    """Translate a functional-format problem into a Triton candidate module.

    Raises `TranslationError` when the problem is not in the format or uses an
    operator or parameter the templates do not cover.
    """
    program = parse_program(source)
    kernels = plan(program)
    module = Module(kernels)
    module.defined.update(program.inputs)
    module.host(*(f"{name} = {name}.contiguous()" for name in program.inputs))
    for group in kernels.groups:
        family = group.anchor.family if group.anchor else None
        module.host("")
        module.comment("; ".join(describe(op) for op in group_ops(group)))
        for name, prologue in group.prologues.items():  # computed inside this kernel's loads
            module.host(f"{name}_shape = {elementwise.output_shape(module, prologue.ops[0])}")
            module.shapes[name] = f"{name}_shape"
        TEMPLATES[family](module, group)
    module.host("", f"return [{', '.join(kernels.returns)}]")
    return Translation(
        code=render(module),
        kernel_count=len(module.kernels),
        operators=tuple(op.kind for op in program.ops),
        kernels=tuple(tuple(op.kind for op in group_ops(group)) for group in kernels.groups),
    )
