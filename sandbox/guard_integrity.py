"""What a candidate's call may not leave behind: the process state `sandbox.guard` checks
after every call, before the harness touches anything the call returned.

Each check compares the process with a baseline taken before the candidate's module was
loaded, using functions bound when this module was imported (before any candidate code
ran), so that rebinding `os.listdir` or `signal.getsignal` does not blind it:

- module dictionaries the harness and the instruments rely on (`builtins`, `torch`,
  `torch.Tensor`, the dispatch helpers, `threading`, `ctypes`, `json`, the sandbox's own
  modules...): an entry rebound means code of the candidate's would run in the harness's
  place after the call (entries added later, as lazy imports add them, are not judged);
- hooks that run code later: profile and trace functions, `gc.callbacks`, import hooks,
  `sys.excepthook` and friends, signal handlers and interval timers;
- threads: one alive after the call that was not there before it (and is not a CUDA
  driver or LLVM worker thread) may still be computing, beside the instruments of this
  thread (dispatch modes are per thread);
- the dispatch state of the calling thread: exactly the guard's mode on the dispatch
  stack, no torch-function mode, the dispatch-key sets as they were when the call began.

Each check returns None or a sentence saying what changed.
"""

from __future__ import annotations

import builtins
import gc
import os
import signal
import sys
import threading
from collections.abc import Iterable
from typing import Any

import torch

_listdir = os.listdir
_open = builtins.open
_getsignal = signal.getsignal
_getitimer = signal.getitimer
_valid_signals = tuple(signal.valid_signals())
_getprofile = sys.getprofile
_gettrace = sys.gettrace
_dispatch_len = torch._C._len_torch_dispatch_stack
_dispatch_at = torch._C._get_dispatch_stack_at
_function_len = torch._C._len_torch_function_stack
_include_set = torch._C._dispatch_tls_local_include_set
_exclude_set = torch._C._dispatch_tls_local_exclude_set
_function_enabled = torch._C._is_torch_function_enabled
_len, _str, _tuple = len, str, tuple
_TIMERS = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)
# Threads the CUDA driver and LLVM start on their own (named by them, not by Python).
_SYSTEM_THREADS = ("cuda", "llvm-worker")
# `sys` entries that change without anyone tampering.
_VOLATILE_SYS = frozenset({"last_type", "last_value", "last_traceback", "exc_info", "_git"})
# `sys` lists whose contents run code when used (import hooks).
_HOOK_LISTS = ("meta_path", "path_hooks")


def watched_modules() -> list[tuple[str, Any]]:
    """(label, namespace) pairs whose existing entries must not be rebound."""
    import ctypes
    import json
    import multiprocessing.connection
    import time

    import torch.utils._python_dispatch as python_dispatch

    spaces: list[tuple[str, Any]] = [
        ("builtins", builtins),
        ("torch", torch),
        ("torch._C", torch._C),
        ("torch.Tensor", torch.Tensor),
        ("torch.UntypedStorage", torch.UntypedStorage),
        ("torch.TypedStorage", torch.TypedStorage),
        ("torch._ops", torch._ops),
        ("torch._ops.OpOverload", torch._ops.OpOverload),
        ("torch.utils._python_dispatch", python_dispatch),
        ("TorchDispatchMode", python_dispatch.TorchDispatchMode),
        ("torch.cuda", torch.cuda),
        ("threading", threading),
        ("threading.Thread", threading.Thread),
        ("ctypes", ctypes),
        ("json", json),
        ("os", os),
        ("time", time),
        ("gc", gc),
        ("signal", signal),
        ("multiprocessing.connection", multiprocessing.connection),
        ("Connection", multiprocessing.connection.Connection),
    ]
    for name in ("_thread", "numpy", "triton", "triton.runtime.jit", "triton.runtime.autotuner"):
        if name in sys.modules:
            spaces.append((name, sys.modules[name]))
    for name, module in list(sys.modules.items()):
        if name == "sandbox" or name.startswith("sandbox."):
            spaces.append((name, module))
    return spaces


def sandbox_classes() -> list[tuple[str, type]]:
    """The classes the sandbox's own modules define (the harness, the instruments, the
    clock...): a method or property added to one, or replaced, would run code of the
    candidate's where the harness calls its own."""
    classes = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "sandbox" or name.startswith("sandbox.")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and vars(value).get("__module__") == name:
                classes.append((f"{name}.{value.__qualname__}", value))
    return classes


def _class_code(cls: type, _vars: Any = vars, _type: Any = type) -> dict[str, Any]:
    """A class's entries that run code: functions, descriptors, classes (not counters)."""
    return {k: v for k, v in _vars(cls).items() if callable(v) or hasattr(_type(v), "__get__")}


class Baseline:
    """The state a call must leave as it found it (taken before the candidate loads)."""

    def __init__(self, extra: Iterable[tuple[str, Any]] = ()) -> None:
        spaces = [*watched_modules(), *extra]
        self.spaces = [(label, space, _code_entries(space)) for label, space in spaces]
        self.classes = [(label, cls, _class_code(cls)) for label, cls in sandbox_classes()]
        self.sys_entries = {k: v for k, v in _code_entries(sys).items() if k not in _VOLATILE_SYS}
        self.hook_lists = {name: _tuple(getattr(sys, name)) for name in _HOOK_LISTS}
        self.gc_callbacks = _tuple(gc.callbacks)
        self.handlers = {s: _getsignal(s) for s in _valid_signals}
        self.threads = thread_names()
        self.threading_hooks = (threading._profile_hook, threading._trace_hook)

    def rebound(self, _vars: Any = vars, _tuple: Any = tuple) -> str | None:
        """The first watched entry that no longer holds what it held (builtins bound as
        defaults: rebinding `builtins.vars` cannot blind it)."""
        for label, space, entries in self.spaces:
            now = _vars(space)
            for key, value in entries.items():
                if now.get(key, value) is not value:
                    return f"rebound {label}.{key}"
        for label, cls, code in self.classes:
            now = _class_code(cls)
            if now.keys() != code.keys() or any(now[k] is not v for k, v in code.items()):
                return f"changed the sandbox's class {label}"
        now = _vars(sys)
        for key, value in self.sys_entries.items():
            if now.get(key, value) is not value:
                return f"rebound sys.{key}"
        for name, items in self.hook_lists.items():
            if _tuple(now.get(name, ())) != items:
                return f"changed sys.{name}"
        if _tuple(gc.callbacks) != self.gc_callbacks:
            return "changed gc.callbacks"
        return None

    def hooks(self) -> str | None:
        """A profile, trace, signal or timer hook that would run code after the call."""
        if _getprofile() is not None or _gettrace() is not None:
            return "set a profile or trace function"
        if (threading._profile_hook, threading._trace_hook) != self.threading_hooks:
            return "set a thread profile or trace function"
        for number, handler in self.handlers.items():
            now = _getsignal(number)
            if now is not handler and callable(now):  # SIG_IGN/SIG_DFL run no code
                return f"set a handler for signal {number}"
        for timer in _TIMERS:
            if _getitimer(timer) != (0.0, 0.0):
                return "started an interval timer"
        return None

    def mark_threads(self) -> None:
        """The threads alive as a stretch of candidate code begins."""
        self.threads = thread_names()

    def new_threads(self) -> str | None:
        """A thread alive now that was not when the stretch began (the CUDA driver's and
        LLVM's own aside)."""
        for tid, name in thread_names().items():
            if tid not in self.threads and not name.startswith(_SYSTEM_THREADS):
                return f"left a thread running ({name or '?'})"
        return None


def _code_entries(space: Any) -> dict[str, Any]:
    """The entries of a namespace that run code when used (callables, classes, modules);
    plain values (flags, counters, caches) change without anyone tampering."""
    return {k: v for k, v in vars(space).items() if callable(v) or isinstance(v, type(sys))}


def dispatch_state(mode: Any, include: str, exclude: str) -> str | None:
    """Whether the calling thread's dispatch state is as the call began: the guard's mode
    alone on the stack (none when `mode` is None), the same dispatch-key sets."""
    if _dispatch_len() != (0 if mode is None else 1) or (
        mode is not None and _dispatch_at(0) is not mode
    ):
        return "changed the dispatch mode stack"
    if _function_len() != 0 or not _function_enabled():
        return "pushed a torch function mode or disabled torch functions"
    if _str(_include_set()) != include or _str(_exclude_set()) != exclude:
        return "changed the dispatch key sets"
    return None


def key_sets() -> tuple[str, str]:
    return _str(_include_set()), _str(_exclude_set())


def thread_names() -> dict[str, str]:
    """This process's threads (task ids) and their names."""
    names = {}
    for tid in _listdir("/proc/self/task"):
        try:
            with _open(f"/proc/self/task/{tid}/comm") as handle:
                names[tid] = handle.read().strip()
        except OSError:  # gone meanwhile
            continue
    return names


def loose_ends(values: Iterable[Any]) -> str | None:
    """A tensor that would run code of the candidate's when the harness lets it go: one
    with attributes of its own (an object with a finaliser) or weak references (a
    `weakref.finalize` callback)."""
    import weakref

    for value in values:
        if type(value) is torch.Tensor and (
            weakref.getweakrefcount(value) or _len(object.__getattribute__(value, "__dict__"))
        ):
            return "attached attributes or weak references to a tensor"
    return None
