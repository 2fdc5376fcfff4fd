"""Instruments a candidate process: counts Triton launches, poisons PyTorch compute.

Runs inside the untrusted candidate process, installed *before* the candidate is
imported, so references the candidate captures at import time are already ours.
Everything here can in principle be undone by hostile code in the same process;
the grader therefore never trusts it alone (outputs and inputs are compared in the
grader's process, and `intact()` reports tampering with the instruments).

- Launch counting: wraps `JITFunction.run` (and the interpreter's equivalent).
  In "noop" mode launches do nothing, so an answer that survives is not Triton's
  (and fresh `torch.empty` memory reads NaN, not a previous call's output).
  In "compile" mode a launch compiles and loads its kernel but runs nothing (an
  autotuned kernel compiles every config it would try, and tunes nothing): the
  grader runs the candidate so once on a GPU, before its trials, so that compiling
  (seconds of CPU) happens while the job holds no share of the GPU. Under the CPU
  interpreter, which cannot benchmark, an autotuned kernel runs its first config.
  A real launch runs with the dispatch guard suspended (the CPU interpreter moves
  tensors with ATen ops of its own).
- Fallback poisoning: a `TorchDispatchMode` sees every ATen op however it was
  reached (`torch.*`, `F.*`, Tensor methods and operators, `torch.ops.aten`, names
  built with `getattr`). Compute ops run, then their results are filled with NaN;
  allocation, views and metadata stay untouched.
- Escapes: while the candidate runs, converting tensors to NumPy or Python values,
  starting threads (dispatch modes are per thread), `torch.compile` (it writes the
  kernels, not the candidate) and suspending dispatch modes all raise.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._python_dispatch as python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

# ATen ops that only allocate, fill with a constant, or describe memory. Any other
# non-view op computes, and is poisoned in the fallback check.
ALLOWED_OPS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "zeros",
        "zeros_like",
        "new_zeros",
        "ones",
        "ones_like",
        "new_ones",
        "full",
        "full_like",
        "new_full",
        "zero_",
        "fill_",
        "arange",
        "lift_fresh",
        "detach",
        "resize_",
        "set_",
        "is_same_size",
        "_has_compatible_shallow_copy_type",
        "is_contiguous",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "record_stream",
    }
)


class ForbiddenOperation(RuntimeError):
    """The candidate moved data or work out of Triton (NumPy, threads, torch.compile)."""


class TamperingDetected(RuntimeError):
    """The candidate interfered with the instruments (suspended the dispatch guard)."""


class _State(threading.local):
    def __init__(self) -> None:
        self.candidate_running = False


_state = _State()
launches = 0
launch_mode = "normal"  # "normal", "noop" or "compile"
# Captured before any candidate code runs: our way to step outside the guard.
_stack_len = torch._C._len_torch_dispatch_stack
_stack_pop = torch._C._pop_torch_dispatch_stack
_stack_push = torch._C._push_on_torch_dispatch_stack


@contextlib.contextmanager
def _suspend_modes() -> Any:
    """Run with every dispatch mode of this thread set aside (a real Triton launch)."""
    modes = [_stack_pop(None) for _ in range(_stack_len())]
    try:
        yield
    finally:
        for mode in reversed(modes):
            _stack_push(mode)


def is_compute_op(func: torch._ops.OpOverload) -> bool:
    name = func.overloadpacket.__name__
    return not (func.is_view or name in ALLOWED_OPS or name.startswith("_to_dense"))


# NaN written as the bits of a same-size integer. CUDA loads a kernel on its first launch,
# and a candidate process loads the int32 fill when it starts (`timing.bind_clock` zeroes
# its int32 L2-flush buffer): a float32 NaN fill of its own cost the no-op check 46 ms at 8
# busy workers on an H200 and 147 ms at 16 (4 ms for the poison check), inside the job's
# share of the GPU. Loading every fill kernel at start moved that cost, not removed it (jobs
# then waited for their next process to start).
_NAN_BITS = {
    torch.float32: (torch.int32, 0x7FC00000),
    torch.float16: (torch.int16, 0x7E00),
    torch.bfloat16: (torch.int16, 0x7FC0),
    torch.float64: (torch.int64, 0x7FF8000000000000),
}


def _poison(value: Any) -> Any:
    # Called from __torch_dispatch__, where the mode is already set aside.
    if isinstance(value, torch.Tensor):
        if value.dtype in _NAN_BITS and value.layout == torch.strided:
            as_int, bits = _NAN_BITS[value.dtype]
            value.view(as_int).fill_(bits)
        elif value.is_floating_point() or value.is_complex():
            value.fill_(float("nan"))
        elif value.dtype == torch.bool:
            value.fill_(True)
        else:  # a value far from small counts and indices, within the dtype's range
            info = torch.iinfo(value.dtype)
            value.fill_(max(info.min, -123456789) if info.min < 0 else min(info.max, 201))
    elif isinstance(value, list | tuple):
        for item in value:
            _poison(item)
    return value


# ATen ops whose results hold whatever their memory held before. In the no-op check they
# are filled with NaN: PyTorch's caching allocator hands a call the block that the previous
# call's output freed, so with every launch skipped that output would still be in place, and
# for a problem whose answer barely depends on its inputs (a saturated activation) it passes.
UNINITIALISED_OPS = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
)


class PoisonMode(TorchDispatchMode):
    """Runs every ATen op; when armed, fills with NaN the results of compute ops (the fallback
    check) or, with `blanks`, those of the allocations that leave memory as it was (the no-op
    check)."""

    def __init__(self, blanks: bool = False) -> None:
        super().__init__()
        self.armed = False
        self.blanks = blanks
        self.compute_ops: set[str] = set()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # True would wrap __torch_dispatch__ in a Dynamo guard whose first call imports
        # torch._dynamo: over a second of CPU per candidate. torch.compile is blocked
        # while the candidate runs, so there is nothing for the guard to skip.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        result = func(*args, **(kwargs or {}))
        if self.blanks:
            blank = self.armed and func.overloadpacket.__name__ in UNINITIALISED_OPS
            return _poison(result) if blank else result
        if not is_compute_op(func):
            return result
        self.compute_ops.add(str(func.overloadpacket.__name__))
        return _poison(result) if self.armed else result


_LAUNCHER_CLASSES: list[type] = []


def _compile_only(run: Callable[..., Any], fn: Any, args: Any, kwargs: dict[str, Any]) -> None:
    """Compile and load the kernel a launch would run, without running it."""
    try:
        with _suspend_modes():
            kernel = run(fn, *args, **{**kwargs, "warmup": True})
            load = getattr(kernel, "_init_handles", None)
            if callable(load):
                load()  # the module on the GPU, and the launcher
    except Exception:  # noqa: BLE001 - the real launch that follows reports it
        pass


def _wrap_launcher(run: Callable[..., Any]) -> Callable[..., Any]:
    def counted_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        global launches
        if kwargs.get("warmup"):
            return run(self, *args, **kwargs)
        if type(self) not in _LAUNCHER_CLASSES:
            raise TamperingDetected("a Triton launcher was called on a foreign object")
        if launch_mode == "compile":
            _compile_only(run, self, args, kwargs)
            return None
        launches += 1
        if launch_mode == "noop":
            return None
        with _suspend_modes():
            return run(self, *args, **kwargs)

    counted_run.__drtriton_wrapper__ = True  # type: ignore[attr-defined]
    return counted_run


def _pruned_configs(tuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The configs an autotuner would try for these arguments (pruning reads `nargs`)."""
    tuner.nargs = dict(zip(tuner.arg_names, args, strict=False))
    try:
        return list(tuner.prune_configs(kwargs))
    finally:
        tuner.nargs = None


def _untuned_run(tuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The interpreter cannot benchmark: run the first config the tuner would try."""
    config = _pruned_configs(tuner, args, kwargs)[0]
    tuner.best_config = config
    if config.pre_hook is not None:
        named = dict(zip(tuner.arg_names, args, strict=False))
        config.pre_hook({**named, **kwargs, **config.all_kwargs()})
    return tuner.fn.run(*args, **kwargs, **config.all_kwargs())


def _wrap_autotuner(run: Callable[..., Any], interpreted: bool) -> Callable[..., Any]:
    def tuned_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if launch_mode != "compile":
            return _untuned_run(self, args, kwargs) if interpreted else run(self, *args, **kwargs)
        # Compile every config the tuner would try; benchmark nothing, cache nothing.
        try:
            configs = _pruned_configs(self, args, kwargs)
        except Exception:  # noqa: BLE001 - the real launch that follows reports it
            configs = []
        for config in configs:
            with contextlib.suppress(Exception):
                self.fn.run(*args, **kwargs, **config.all_kwargs())
        return None

    tuned_run.__drtriton_wrapper__ = True  # type: ignore[attr-defined]
    return tuned_run


def _while_candidate(
    original: Callable[..., Any], error: type[Exception], what: str
) -> Callable[..., Any]:
    """Wrap `original` so that it raises while the candidate runs."""

    def blocked(*args: Any, **kwargs: Any) -> Any:
        if _state.candidate_running:
            raise error(what)
        return original(*args, **kwargs)

    blocked.__drtriton_wrapper__ = True  # type: ignore[attr-defined]
    return blocked


# (owner, attribute, exception, message): what the candidate may not call.
def _blocked_calls() -> list[tuple[Any, str, type[Exception], str]]:
    import _thread

    escape = "moves data out of PyTorch/Triton; compute in a Triton kernel"
    blocked: list[tuple[Any, str, type[Exception], str]] = [
        (torch.Tensor, name, ForbiddenOperation, f"Tensor.{name}() {escape}")
        for name in ("numpy", "__array__", "tolist", "item")
    ]
    blocked += [
        (threading.Thread, "start", ForbiddenOperation, "threads are not allowed in a candidate"),
        (_thread, "start_new_thread", ForbiddenOperation, "threads are not allowed in a candidate"),
        (
            torch,
            "compile",
            ForbiddenOperation,
            "torch.compile writes the kernels: write them yourself",
        ),
    ]
    memory = "the candidate changed its GPU memory cap"
    for owner in (torch.cuda, torch.cuda.memory):
        blocked.append((owner, "set_per_process_memory_fraction", TamperingDetected, memory))
    if hasattr(torch._C, "_cuda_setMemoryFraction"):
        blocked.append((torch._C, "_cuda_setMemoryFraction", TamperingDetected, memory))
    tamper = "the candidate suspended the PyTorch dispatch guard"
    for owner, name in (
        (python_dispatch, "_disable_current_modes"),
        (python_dispatch, "_pop_mode"),
        (python_dispatch, "_pop_mode_temporarily"),
        (torch._C, "_pop_torch_dispatch_stack"),
        (torch._C, "_unset_dispatch_mode"),
        (torch._C, "_DisableTorchDispatch"),
    ):
        if hasattr(owner, name):
            blocked.append((owner, name, TamperingDetected, tamper))
    return blocked


_BLOCKED: list[tuple[Any, str]] = []


def install() -> None:
    """Wrap Triton's launchers and the escape hatches (idempotent)."""
    from triton.runtime import jit

    classes: list[type] = [jit.JITFunction]
    with contextlib.suppress(ImportError):
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    for cls in classes:
        if not getattr(cls.run, "__drtriton_wrapper__", False):
            cls.run = _wrap_launcher(cls.run)
        if cls not in _LAUNCHER_CLASSES:
            _LAUNCHER_CLASSES.append(cls)
    with contextlib.suppress(ImportError):
        from triton.runtime.autotuner import Autotuner

        if not getattr(Autotuner.run, "__drtriton_wrapper__", False):
            interpreted = os.environ.get("TRITON_INTERPRET") == "1"
            Autotuner.run = _wrap_autotuner(Autotuner.run, interpreted)
    for owner, name, error, message in _blocked_calls():
        original = getattr(owner, name)
        if not getattr(original, "__drtriton_wrapper__", False):
            setattr(owner, name, _while_candidate(original, error, message))
        _BLOCKED.append((owner, name))


def intact(mode: PoisonMode | None = None) -> str | None:
    """Say what the candidate undid, or None when every instrument is in place."""
    for cls in _LAUNCHER_CLASSES:
        if not getattr(cls.run, "__drtriton_wrapper__", False):
            return f"{cls.__name__}.run was replaced"
    for owner, name in _BLOCKED:
        if not getattr(getattr(owner, name), "__drtriton_wrapper__", False):
            return f"{getattr(owner, '__name__', owner)}.{name} was replaced"
    if mode is not None:
        stack = python_dispatch._get_current_dispatch_mode_stack()
        if not stack or stack[-1] is not mode:
            return "the dispatch guard was removed"
    return None


class candidate_call:
    """Context for one call of the candidate: sets the launch mode, arms poisoning."""

    def __init__(self, mode: str) -> None:
        if mode not in ("normal", "poison", "noop", "compile"):
            raise ValueError(mode)
        self.mode = mode
        self.poison: PoisonMode | None = (
            PoisonMode(blanks=mode == "noop") if mode in ("poison", "noop") else None
        )

    def __enter__(self) -> candidate_call:
        global launches, launch_mode
        launches = 0
        launch_mode = self.mode if self.mode in ("noop", "compile") else "normal"
        if self.poison is not None:
            self.poison.armed = True
            self.poison.__enter__()
        _state.candidate_running = True
        return self

    def __exit__(self, *exc: object) -> None:
        global launch_mode
        _state.candidate_running = False
        launch_mode = "normal"
        if self.poison is not None:
            self.poison.armed = False
            # The candidate may have popped the mode itself; `intact` reports that.
            with contextlib.suppress(Exception):
                self.poison.__exit__(None, None, None)
