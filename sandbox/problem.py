"""Problems as the grader sees them: inputs for a seed, and reference outputs.

Both formats share one interface. Functional problems (DESIGN §2) define
`get_inputs()` and `fused_operator(...)`; KernelBench problems define `Model`,
`get_inputs()` and `get_init_inputs()` and are instantiated under a fixed seed,
as KernelBench does, so that `ModelNew` built under the same seed gets the same
weights.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import hashlib
import importlib.util
import inspect
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FORMATS = ("functional", "kernelbench")
INIT_SEED = 42


class ProblemError(Exception):
    """The problem itself is broken (not the candidate's fault)."""


def detect_format(source: str) -> str:
    """'functional' or 'kernelbench', from the names the source defines."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:  # NUL bytes, nesting
        raise ProblemError(f"problem does not parse: {type(err).__name__}: {err}") from None
    names = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
    }
    if "fused_operator" in names and "get_inputs" in names:
        return "functional"
    if "Model" in names and "get_inputs" in names:
        return "kernelbench"
    raise ProblemError(
        "problem defines neither get_inputs()+fused_operator() nor Model+get_inputs()"
    )


def source_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:24]


@dataclass
class Problem:
    """A loaded problem bound to a device."""

    format: str
    module: Any
    device: str
    init_inputs: list[Any]
    reference_fn: Callable[..., Any]

    def make_inputs(self, seed: int) -> list[Any]:
        import torch

        torch.manual_seed(seed)
        # Drawn on the device itself: CPU random numbers for GiB-sized inputs cost seconds.
        with torch.device(self.device):
            inputs = self.module.get_inputs()
        if not isinstance(inputs, list | tuple):
            raise ProblemError("get_inputs() must return a list")
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]

    def io_bytes(self) -> int:
        """Bytes of one set of inputs and outputs, from shapes alone (meta tensors: no
        memory, no work). Outputs count where the reference runs on meta tensors."""
        import torch

        def size(values: Any) -> int:
            values = [values] if isinstance(values, torch.Tensor) else values
            return sum(x.numel() * x.element_size() for x in values if isinstance(x, torch.Tensor))

        try:
            with torch.device("meta"):
                inputs = self.module.get_inputs()
        except Exception:  # noqa: BLE001 - unknown: the caller assumes the minimum
            return 0
        total = size(inputs)
        # A Triton kernel launched on meta tensors reads address 0 on the GPU: an illegal
        # access that ends the process's CUDA context (the grader's, here).
        if self.format == "functional" and not _uses_triton(self.module):
            with contextlib.suppress(Exception), torch.no_grad():
                total += size(self.reference_fn(*inputs))
        return total

    def input_layout(self) -> list[dict[str, Any]]:
        """Shape and dtype of each input tensor (the value of anything else), without data."""
        import torch

        try:
            with torch.device("meta"):
                inputs = self.module.get_inputs()
        except Exception:  # noqa: BLE001 - meta tensors unsupported here: draw real ones
            inputs = self.make_inputs(0)
        return [
            {"shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch.")}
            if isinstance(x, torch.Tensor)
            else {"value": x}
            for x in inputs
        ]

    def reference(self, inputs: list[Any], fn: Callable[..., Any] | None = None) -> list[Any]:
        import torch

        with torch.no_grad():
            out = (fn or self.reference_fn)(*inputs)
        if isinstance(out, torch.Tensor):
            out = [out]
        if not isinstance(out, list | tuple) or not all(isinstance(o, torch.Tensor) for o in out):
            raise ProblemError("the reference must return a tensor or a list of tensors")
        return list(out)

    def reference_float64(self, inputs: list[Any], device: str | None = None) -> list[Any]:
        """The reference computed in float64 on the same inputs: how far from exact its
        float32 answer is (`compare.rounding_noise`). Tensors the problem creates itself
        take the default dtype, float64 here; a module (KernelBench) is copied, not changed.
        `device` moves the work (the host has room where a full GPU has none).
        """
        import torch

        def widened(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            x = x.to(device) if device is not None else x
            return x.double() if x.is_floating_point() else x

        wide = [widened(x) for x in inputs]
        fn = self.reference_fn
        if isinstance(fn, torch.nn.Module):
            fn = copy.deepcopy(fn)
            fn = (fn.to(device) if device is not None else fn).double()  # moved, then widened
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            with _float32_widened():
                return self.reference(wide, fn)
        finally:
            torch.set_default_dtype(previous)


@contextlib.contextmanager
def _float32_widened() -> Any:
    """Every float32 tensor an operation returns comes back as float64.

    A problem that casts on its own (`argmax(...).float()` feeding a conv) would otherwise
    mix float32 and float64 in its float64 run, which fails, and leave that problem with
    no rounding allowance.
    """
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_map

    def widen(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
            return value.double()
        return value

    class Widening(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return tree_map(widen, func(*args, **(kwargs or {})))

    with Widening():
        yield


def _uses_triton(module: Any) -> bool:
    """Whether the problem's own code holds Triton (the module, or a kernel of it)."""
    for value in vars(module).values():
        owner = value.__name__ if inspect.ismodule(value) else type(value).__module__
        if owner == "triton" or owner.startswith("triton."):
            return True
    return False


def load_problem(source: str, fmt: str, device: str, workdir: str | None = None) -> Problem:
    """Import the problem from a real file (Triton and inspect need one)."""
    import torch

    if fmt == "auto":
        fmt = detect_format(source)
    if fmt not in FORMATS:
        raise ProblemError(f"unknown problem format {fmt!r}")
    directory = workdir or tempfile.mkdtemp(prefix="drtriton-problem-")
    path = os.path.join(directory, f"problem_{source_key(source)}.py")
    with open(path, "w") as handle:
        handle.write(source)
    name = f"drtriton_problem_{source_key(source)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ProblemError("cannot import the problem")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - any failure is the problem's
        raise ProblemError(f"problem failed at import: {type(err).__name__}: {err}") from None
    needed = ("fused_operator", "get_inputs") if fmt == "functional" else ("Model", "get_inputs")
    missing = [name for name in needed if not callable(getattr(module, name, None))]
    if missing:
        raise ProblemError(f"a {fmt} problem must define {' and '.join(missing)}")
    if fmt == "functional":
        return Problem(fmt, module, device, [], module.fused_operator)
    try:
        init_inputs = list(module.get_init_inputs()) if hasattr(module, "get_init_inputs") else []
        torch.manual_seed(INIT_SEED)
        model = module.Model(*init_inputs).to(device).eval()
    except torch.cuda.OutOfMemoryError:
        raise  # the GPU's room, the sandbox's to manage
    except Exception as err:  # noqa: BLE001 - any other failure is the problem's
        raise ProblemError(f"the problem's Model failed: {type(err).__name__}: {err}") from None
    return Problem(fmt, module, device, init_inputs, model)
