"""An in-process correctness check for trusted candidates (the teacher's own output).

It mirrors the sandbox's rules closely enough to catch template bugs early: outputs
equal PyTorch's on several seeds (shape, dtype, values), inputs are not modified,
outputs are fresh tensors, and no PyTorch compute op runs outside Triton launches.
It runs candidate code in this process, so it is for tests and development only;
`drtriton teacher build` verifies through the sandbox.

On CPU (the default device) kernels need Triton's interpreter: set TRITON_INTERPRET=1
before triton is first imported. `compile_for_gpu` complements the interpreter by
compiling the launched kernels for an NVIDIA GPU ahead of time, without one.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# ATen ops that allocate or describe memory; every other non-view op computes.
ALLOWED_ATEN = frozenset(
    {"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "fill_", "zero_"}
    | {"is_contiguous", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "detach"}
    | {"lift_fresh", "new_empty", "new_empty_strided"}
)


class TorchComputeError(RuntimeError):
    """The candidate computed with PyTorch outside a Triton kernel."""


class _ForbidCompute(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.in_launch = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        name = func.overloadpacket.__name__
        if not self.in_launch and not func.is_view and name not in ALLOWED_ATEN:
            raise TorchComputeError(f"torch op aten.{name} ran outside a Triton kernel")
        return func(*args, **(kwargs or {}))


@contextmanager
def forbid_torch_compute():
    """Raise on any PyTorch compute op that is not inside a Triton kernel launch."""
    import triton.runtime.interpreter as interpreter
    from triton.runtime import jit

    mode = _ForbidCompute()
    patched = []
    for cls in (jit.JITFunction, interpreter.InterpretedFunction):
        original = cls.run

        def run(self, *args, __original=original, **kwargs):
            mode.in_launch += 1
            try:
                return __original(self, *args, **kwargs)
            finally:
                mode.in_launch -= 1

        cls.run = run
        patched.append((cls, original))
    try:
        with mode:
            yield
    finally:
        for cls, original in patched:
            cls.run = original


def fix_interpreter_scalar_index() -> None:
    """Let Triton 3.6's interpreter run loops with run-time bounds under NumPy >= 2.4.

    The interpreter stores scalars as 1-element arrays and converts them with `int()`,
    which NumPy 2.4 refuses (triton-lang/triton#9171, fixed upstream after 3.6).
    """
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "scalar_index_fix", False):
        return

    def patched(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.scalar_index_fix = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


def import_source(source: str, directory: str | Path | None = None) -> ModuleType:
    """Import Python source from a real file (`@triton.jit` needs one)."""
    directory = Path(directory or tempfile.mkdtemp(prefix="teacher_"))
    name = f"candidate_{uuid.uuid4().hex[:12]}"
    path = directory / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class CheckResult:
    correct: bool
    message: str = ""
    max_abs_error: float = 0.0
    errors: list[str] = field(default_factory=list)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def check_candidate(
    problem: str,
    candidate: str,
    *,
    seeds: tuple[int, ...] = (0, 1, 2),
    atol: float = 1e-4,
    rtol: float = 1e-4,
    guard: bool = True,
    device: str = "cpu",
) -> CheckResult:
    """Run the candidate against the problem's reference on several seeds."""
    fix_interpreter_scalar_index()
    reference = import_source(problem)
    module = import_source(candidate)
    worst = 0.0
    for seed in seeds:
        torch.manual_seed(seed)
        inputs = [x.to(device) for x in reference.get_inputs()]
        originals = [x.clone() for x in inputs]
        expected = _as_list(reference.fused_operator(*[x.clone() for x in inputs]))
        try:
            if guard:
                with forbid_torch_compute():
                    got = _as_list(module.triton_fused_operator(*inputs))
            else:
                got = _as_list(module.triton_fused_operator(*inputs))
        except Exception as err:  # noqa: BLE001 - any failure is a verdict
            return CheckResult(False, f"seed {seed}: {type(err).__name__}: {err}")
        if len(got) != len(expected):
            return CheckResult(False, f"seed {seed}: {len(got)} outputs, expected {len(expected)}")
        for x, original in zip(inputs, originals, strict=True):
            if not torch.equal(x, original):
                return CheckResult(False, f"seed {seed}: an input was modified")
        for i, (out, ref) in enumerate(zip(got, expected, strict=True)):
            if not isinstance(out, torch.Tensor):
                return CheckResult(False, f"seed {seed}: output {i} is not a tensor")
            if any(
                out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for x in inputs
            ):
                return CheckResult(False, f"seed {seed}: output {i} aliases an input")
            if out.shape != ref.shape or out.dtype != ref.dtype:
                return CheckResult(
                    False,
                    f"seed {seed}: output {i} is {out.dtype}{list(out.shape)}, "
                    f"expected {ref.dtype}{list(ref.shape)}",
                )
            if ref.numel():
                worst = max(worst, (out - ref).abs().max().item())
            if not torch.allclose(out, ref, atol=atol, rtol=rtol):
                return CheckResult(
                    False, f"seed {seed}: output {i} differs (max abs error {worst:.3g})", worst
                )
    return CheckResult(True, "", worst)


def compile_for_gpu(
    problem: str, candidate: str, arch: int = 90, ptx: list[str] | None = None
) -> list[str]:
    """Compile every kernel the candidate launches for an NVIDIA GPU, without one.

    Runs the host code on CPU tensors with launches replaced by ahead-of-time
    compilation for `sm_{arch}`, specialised as Triton's JIT specialises a real launch
    (constexprs, integers equal to 1, pointers and integers divisible by 16), so errors
    that Triton's interpreter does not model (loop-carried type changes, `tl.dot`
    shapes, unsupported operations) show up on a machine without a GPU, and the PTX is
    the PTX the GPU would run. Must run with TRITON_INTERPRET unset. Returns the compile
    errors (empty: all good); appends each launch's PTX to `ptx` when given.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime import jit

    errors: list[str] = []
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    reference = import_source(problem)
    module = import_source(candidate)

    def compile_launch(
        self: Any, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any
    ) -> None:
        del grid, warmup
        try:
            binder = jit.create_function_from_signature(self.signature, self.params, backend)
            bound, specialization, options = binder(*args, **kwargs)
            options, signature, constexprs, attrs = self._pack_args(
                backend, kwargs, bound, specialization, options
            )
            source = ASTSource(fn=self, signature=signature, constexprs=constexprs, attrs=attrs)
            compiled = triton.compile(source, target=target, options=options.__dict__)
            if ptx is not None:
                ptx.append(compiled.asm["ptx"])
        except Exception as err:  # noqa: BLE001 - reported, not raised
            errors.append(f"{self.__name__}: {type(err).__name__}: {str(err).strip()[:2000]}")

    original = jit.JITFunction.run
    jit.JITFunction.run = compile_launch
    try:
        torch.manual_seed(0)
        module.triton_fused_operator(*reference.get_inputs())
    finally:
        jit.JITFunction.run = original
    return errors


def compile_for_gpu_isolated(pairs: list[tuple[str, str]], arch: int = 90) -> list[list[str]]:
    """`compile_for_gpu` for many (problem, candidate) pairs, in a fresh process.

    Triton fixes interpreted vs compiled mode when it is first imported, so a process
    that runs kernels under the interpreter cannot also compile them for a GPU.
    Returns the compile errors of each pair, in order.
    """
    return [errors for errors, _ in _compile_isolated(pairs, arch)]


def ptx_for_gpu_isolated(problem: str, candidate: str, arch: int = 90) -> list[str]:
    """The PTX of each launch of the candidate, in launch order (compiled as for a GPU,
    in a fresh process); raises RuntimeError on a compile error."""
    ((errors, ptx),) = _compile_isolated([(problem, candidate)], arch)
    if errors:
        raise RuntimeError("\n".join(errors))
    return ptx


def _compile_isolated(pairs: list[tuple[str, str]], arch: int) -> list[tuple[list[str], list[str]]]:
    """(errors, PTX per launch) of each pair, compiled in a fresh process."""
    import json
    import os
    import subprocess

    with tempfile.TemporaryDirectory(prefix="teacher_gpu_") as tmp:
        request = Path(tmp) / "pairs.json"
        request.write_text(json.dumps({"arch": arch, "pairs": pairs}))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        run = subprocess.run(
            [sys.executable, "-m", "synth.teacher.check", str(request)],
            capture_output=True,
            text=True,
            env=env,
            cwd=root,
        )
        if run.returncode != 0:
            raise RuntimeError(f"GPU compile process failed: {run.stderr.strip()[-2000:]}")
        return [tuple(item) for item in json.loads((Path(tmp) / "compiled.json").read_text())]


def _compile_main(path: str) -> None:
    import json

    request = json.loads(Path(path).read_text())
    compiled = []
    for problem, candidate in request["pairs"]:
        ptx: list[str] = []
        compiled.append((compile_for_gpu(problem, candidate, request["arch"], ptx), ptx))
    (Path(path).parent / "compiled.json").write_text(json.dumps(compiled))


if __name__ == "__main__":
    _compile_main(sys.argv[1])
