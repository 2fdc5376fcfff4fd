"""Instruments a candidate process: counts Triton launches, poisons PyTorch compute.

Runs inside the untrusted candidate process, installed *before* the candidate is
imported, so references the candidate captures at import time are already ours.
Everything here can in principle be undone by hostile code in the same process;
the grader therefore never trusts it alone (outputs are compared elsewhere, and
`intact()` reports tampering with the instruments themselves).

- Launch counting: wraps `JITFunction.run` (and the interpreter's equivalent).
  In "noop" mode launches do nothing, so an answer that survives is not Triton's.
- Fallback poisoning: a `TorchDispatchMode` sees every ATen op however it was
  reached (`torch.*`, `F.*`, Tensor methods and operators, `torch.ops.aten`, names
  built with `getattr`). Compute ops run, then their results are filled with NaN;
  allocation, views and metadata stay untouched.
- NumPy and Python escapes: converting a tensor to NumPy or Python values
  raises `ForbiddenOperation` while the candidate runs (Triton itself may).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import torch
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
    """The candidate moved tensor data out of PyTorch/Triton (NumPy, Python lists)."""


class _State(threading.local):
    def __init__(self) -> None:
        self.in_launch = 0
        self.candidate_running = False


_state = _State()
launches = 0
launch_mode = "normal"  # "normal" or "noop"


def is_compute_op(func: torch._ops.OpOverload) -> bool:
    name = func.overloadpacket.__name__
    return not (func.is_view or name in ALLOWED_OPS or name.startswith("_to_dense"))


def _poison(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        with torch.utils._python_dispatch._disable_current_modes():
            if value.is_floating_point() or value.is_complex():
                value.fill_(float("nan"))
            elif value.dtype == torch.bool:
                value.fill_(True)
            else:
                value.fill_(-123456789 if value.dtype != torch.uint8 else 201)
    elif isinstance(value, list | tuple):
        for item in value:
            _poison(item)
    return value


class PoisonMode(TorchDispatchMode):
    """Runs every ATen op; fills the results of compute ops with NaN when armed."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.compute_ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        result = func(*args, **(kwargs or {}))
        if _state.in_launch or not is_compute_op(func):
            return result
        self.compute_ops.add(str(func.overloadpacket.__name__))
        return _poison(result) if self.armed else result


def _wrap_launcher(run: Callable[..., Any]) -> Callable[..., Any]:
    def counted_run(*args: Any, **kwargs: Any) -> Any:
        global launches
        if kwargs.get("warmup"):
            return run(*args, **kwargs)
        launches += 1
        if launch_mode == "noop":
            return None
        _state.in_launch += 1
        try:
            return run(*args, **kwargs)
        finally:
            _state.in_launch -= 1

    counted_run.__drtriton_wrapper__ = True  # type: ignore[attr-defined]
    return counted_run


def _forbid(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def blocked(*args: Any, **kwargs: Any) -> Any:
        if _state.candidate_running and not _state.in_launch:
            raise ForbiddenOperation(
                f"Tensor.{name}() moves data out of PyTorch/Triton; compute in a Triton kernel"
            )
        return original(*args, **kwargs)

    blocked.__drtriton_wrapper__ = True  # type: ignore[attr-defined]
    return blocked


_LAUNCHER_CLASSES: list[type] = []
_FORBIDDEN = ("numpy", "__array__", "tolist", "item")


def install() -> None:
    """Wrap Triton's launchers and Tensor's escape hatches (idempotent)."""
    from triton.runtime import jit

    classes: list[type] = [jit.JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:
        pass
    for cls in classes:
        if not getattr(cls.run, "__drtriton_wrapper__", False):
            cls.run = _wrap_launcher(cls.run)
        _LAUNCHER_CLASSES.append(cls)
    for name in _FORBIDDEN:
        original = getattr(torch.Tensor, name)
        if not getattr(original, "__drtriton_wrapper__", False):
            setattr(torch.Tensor, name, _forbid(name, original))


def intact(mode: PoisonMode | None = None) -> str | None:
    """Say what the candidate undid, or None when every instrument is in place."""
    for cls in _LAUNCHER_CLASSES:
        if not getattr(cls.run, "__drtriton_wrapper__", False):
            return f"{cls.__name__}.run was replaced"
    for name in _FORBIDDEN:
        if not getattr(getattr(torch.Tensor, name), "__drtriton_wrapper__", False):
            return f"torch.Tensor.{name} was replaced"
    if mode is not None:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        if mode not in _get_current_dispatch_mode_stack():
            return "the dispatch guard was removed"
    return None


class candidate_call:
    """Context for one call of the candidate: sets the launch mode, arms poisoning."""

    def __init__(self, mode: str) -> None:
        if mode not in ("normal", "poison", "noop"):
            raise ValueError(mode)
        self.mode = mode
        self.poison: PoisonMode | None = PoisonMode() if mode == "poison" else None

    def __enter__(self) -> candidate_call:
        global launches, launch_mode
        launches = 0
        launch_mode = "noop" if self.mode == "noop" else "normal"
        _state.candidate_running = True
        if self.poison is not None:
            self.poison.armed = True
            self.poison.__enter__()
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
