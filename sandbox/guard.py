"""Instruments of a candidate process: every call whose output counts runs under one guard.

Installed by the harness before the candidate's module is loaded. What they enforce, the
same way on every call (the compile pass, each trial, the no-launch call among them, the
timed loops), so that no call can be told apart from another by looking at them:

- PyTorch compute is refused: one `TorchDispatchMode`, the same object on every call,
  sees every ATen op however it was reached (inside a launch too: a kernel body the CPU
  interpreter runs as Python) and lets through only allocation, constant fills, noise,
  views and metadata (`sandbox.guard_ops`). A refused op never sees the real values: it
  runs on NaN stand-ins, and the refusal is recorded and becomes the call's verdict.
  Reading tensor values on the host (`.item()`, `bool(t)`, `.tolist()`, storages, NumPy,
  DLPack, pickling, printing, the grader's exchange files, /proc/self/mem) is refused or
  answered from stand-ins, so host code cannot see what any kernel wrote: not its
  answer, and not whether a probe kernel's store landed.
- Triton launches are counted and, in the call the grader picks as the no-launch one,
  skipped. That call looks like any trial: same command, same inputs handling, same mode
  stack; a skipped launch returns what a real one returns; the memory it would have
  written is fresh (NaN) and unreadable. Only the clock tells it apart (a known limit:
  the static gate refuses clocks and timing helpers).
- Escape hatches raise while candidate code runs: threads (dispatch modes are per
  thread), raw memory through ctypes, `torch.frombuffer`/`from_file`, switching dispatch
  modes or dispatch keys off, `torch.library` registrations, `torch.compile`, changing the
  GPU memory cap. An audit hook (which cannot be removed) refuses, whatever the thread:
  child processes, sockets, signals to other processes, new audit hooks, profile and
  trace functions, walking the garbage collector, patching the instruments' classes.
  Refusals are recorded even when the candidate catches the exception.
- After every call, before the harness touches what it returned, the instruments check
  that nothing was left behind (`sandbox.guard_integrity`): the guard alone on the
  dispatch stack, the dispatch keys as they were, no new threads, no hooks, no rebound
  builtins or instruments. Anything else is `tampering`.

State lives in closures made by `install`, not in module attributes a candidate could
flip; the harness reaches it only through the `Instruments` it was handed. All of this
runs inside the candidate's own process, so it is defence in depth: the static gate keeps
the candidate from reaching these objects at all (dunders, `getattr`, frames, private
names), and no figure reported from here decides a verdict in the candidate's favour.
A count or a clean report can only ever reject; acceptance rests on what the grader
sees itself (outputs in its own buffers, the no-launch call's answer).
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sandbox import guard_integrity, guard_ops
from sandbox.guard_hatches import (
    FORBIDDEN,
    TAMPER,
    add_audit_hook,
    protected_names,
    wrap_dispatch_below,
    wrap_escape_hatches,
)

PLANS = ("normal", "noop", "compile")


class ForbiddenOperation(RuntimeError):
    """The candidate moved data or work out of Triton (PyTorch compute, NumPy, threads)."""


class TamperingDetected(RuntimeError):
    """The candidate interfered with the instruments or reached outside its process."""


_ERRORS = {FORBIDDEN: ForbiddenOperation, TAMPER: TamperingDetected}


@dataclass(frozen=True)
class CallReport:
    """What one guarded stretch of candidate code did (read by the harness only)."""

    launches: int  # launches attempted (compiled, skipped or run)
    refusal: tuple[str, str, bool] | None  # (FORBIDDEN or TAMPER, what, ran on), the first
    tampered: str | None  # what the call left changed
    error: tuple[str, str] | None  # (kind from the harness's classifier, text) when it raised

    def failure(self) -> tuple[str, str] | None:
        """(verdict, message) when the call must be rejected, else None."""
        if self.tampered:
            return TAMPER, f"the candidate {self.tampered}"
        if self.refusal is not None:
            kind, what, ran_on = self.refusal
            if kind == FORBIDDEN and ran_on and self.error is None and self.launches == 0:
                # PyTorch refused, and the call ran to its end without one launch.
                return "no_triton_kernel", f"{what}, and no Triton kernel was launched"
            return kind, what
        return self.error


class _State:
    """One process's instruments state; only closures made by `install` hold it."""

    __slots__ = ("armed", "plan", "launches", "in_launch", "refusal")

    def __init__(self) -> None:
        self.armed = False
        self.plan = "normal"
        self.launches = 0
        self.in_launch = 0
        self.refusal: tuple[str, str, bool] | None = None


class Instruments:
    """The harness's handle on the instruments (made by `install`)."""

    def __init__(self, **methods: Callable[..., Any]) -> None:
        self._methods = methods

    def loading(self, classify: Callable[[BaseException], str]) -> Any:
        """Context for importing the candidate and building its model: escape hatches
        shut, PyTorch allowed (parameter set-up). Yields a `Stretch` with the report."""
        return self._methods["stretch"](None, classify, False)

    def call(self, plan: str, classify: Callable[[BaseException], str], steps: bool = False) -> Any:
        """Context for one call (or, with `steps`, a loop of calls run through
        `Stretch.armed`): the guard's mode on, launches as `plan` says."""
        if plan not in PLANS:
            raise ValueError(f"unknown plan {plan!r}")
        return self._methods["stretch"](plan, classify, steps)


class Stretch:
    """A guarded stretch of candidate code; `report` is set when it ends. An exception
    the candidate raised is swallowed into the report (formatted while still guarded).
    `hold` names what the stretch handed the candidate and got back (its tensors are
    checked for finalisers before the harness lets them go)."""

    def __init__(self, enter: Callable[[], None], leave: Callable[..., CallReport], steps: bool):
        self._enter, self._leave = enter, leave
        self.values: list[Any] = []
        self.report: CallReport | None = None
        self.armed: Callable[[Callable[[], Any]], Callable[[], Any]] = lambda fn: fn
        # The harness's own tensor work between a loop's calls (bringing a timed run's
        # inputs onto the device), run with the guard's mode off the stack.
        self.outside: Callable[[Callable[[], Any]], Any] = lambda fn: fn()
        self.steps = steps

    def hold(self, *values: Any) -> None:
        for value in values:
            if type(value) in (list, tuple):
                self.values.extend(value)
            else:
                self.values.append(value)

    def __enter__(self) -> Stretch:
        self._enter()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.report = self._leave(exc, self.values)
        return True


# Objects of the candidate's the harness must never let go of (their finalisers would run
# unguarded): the exceptions it raised. The process ends with the job, by SIGKILL.
_KEPT: list[Any] = []


def install(device: str = "cpu") -> Instruments:
    """Wrap Triton's launchers and the escape hatches, add the audit hook (once per
    process; later calls return the same instruments)."""
    existing = _INSTALLED.get("instruments")
    if existing is not None:
        return existing
    instruments = _build(device)
    _INSTALLED["instruments"] = instruments
    return instruments


_INSTALLED: dict[str, Instruments] = {}


def _build(device: str) -> Instruments:
    state = _State()
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    format_exception, clear_frames = traceback.format_exception, traceback.clear_frames
    keep = _KEPT.append
    gc_enable, gc_disable = _gc_switches()

    def refuse(kind: str, what: str, raising: bool = True) -> None:
        if state.refusal is None:
            state.refusal = (kind, what, not raising)
        if raising:
            raise _ERRORS[kind](what)

    mode = _make_mode(state, refuse)
    # Bound before the hatches are wrapped: the guard steps on and off the stack with
    # these alone (`TorchDispatchMode.__enter__/__exit__` keep Python state a candidate
    # can corrupt).
    push, pop = torch._C._push_on_torch_dispatch_stack, torch._C._pop_torch_dispatch_stack
    stack_len, stack_at = torch._C._len_torch_dispatch_stack, torch._C._get_dispatch_stack_at
    launcher_classes = _wrap_launchers(state, refuse, interpreted)
    wrapped = wrap_escape_hatches(state, refuse)
    wrap_dispatch_below(state, refuse)
    add_audit_hook(
        state,
        refuse,
        protected_names(launcher_classes, wrapped),
        os.getcwd(),
        compiles=not interpreted,
    )
    baseline = guard_integrity.Baseline([(cls.__name__, cls) for cls in launcher_classes])
    key_sets = [guard_integrity.key_sets()]

    def wrappers_in_place() -> str | None:
        for owner, name, wrapper in wrapped:
            if vars(owner).get(name) is not wrapper:
                return f"replaced {getattr(owner, '__name__', owner)}.{name}"
        return None

    def enter(plan: str | None, steps: bool) -> None:
        state.plan = plan or "normal"
        state.launches = 0
        state.refusal = None
        if plan is not None:
            push(mode)
        key_sets[0] = guard_integrity.key_sets()
        baseline.mark_threads()
        gc_enable()
        state.armed = not steps

    def check(plan: str | None, values: list[Any]) -> str | None:
        found = baseline.rebound() or wrappers_in_place() or baseline.hooks()
        found = found or baseline.new_threads() or guard_integrity.loose_ends(values)
        found = found or guard_integrity.dispatch_state(mode if plan else None, *key_sets[0])
        if found is None and state.in_launch:
            found = "left a launch unfinished"
        return found

    def leave(
        plan: str | None,
        classify: Callable[[BaseException], str],
        exc: BaseException | None,
        values: list[Any],
    ) -> CallReport:
        state.armed = True  # finalisers and hooks that run from here on run guarded
        error = None
        if exc is not None:
            keep(exc)
            try:
                error = (
                    classify(exc),
                    "".join(format_exception(type(exc), exc, exc.__traceback__)),
                )
            except BaseException:  # noqa: BLE001 - the candidate's __str__ may raise
                error = (
                    "runtime_error",
                    "the candidate raised an exception that cannot be printed",
                )
            clear_frames(exc.__traceback__)  # its frames' locals die now, guarded
            del exc
        tampered = check(plan, values)
        report = CallReport(state.launches, state.refusal, tampered, error)
        state.armed = False
        gc_disable()  # nothing of the candidate's is collected while the harness works
        if plan is not None and stack_len() and stack_at(stack_len() - 1) is mode:
            pop(None)  # the guard's mode (whatever else the call left is reported)
        state.plan = "normal"
        return report

    def stretch(plan: str | None, classify: Callable[[BaseException], str], steps: bool) -> Any:
        made = Stretch(
            lambda: enter(plan, steps),
            lambda exc, values: leave(plan, classify, exc, values),
            steps,
        )
        if steps:
            made.armed = lambda fn: _armed(state, fn)
            if plan is not None:
                made.outside = outside
        return made

    def outside(fn: Callable[[], Any]) -> Any:
        """Run the harness's `fn` between a loop's calls, its PyTorch work unrefused. Never
        while a call runs; and when the candidate left a mode above the guard's, `fn` runs
        through the stack as it is (that mode is reported when the stretch ends)."""
        if state.armed:
            refuse(TAMPER, "reached the harness's own work from inside a call")
        on_top = stack_len() and stack_at(stack_len() - 1) is mode
        if on_top:
            pop(None)
        try:
            return fn()
        finally:
            if on_top:
                push(mode)

    return Instruments(stretch=stretch)


def _armed(state: _State, fn: Callable[[], Any]) -> Callable[[], Any]:
    def step() -> Any:
        state.armed = True
        try:
            return fn()
        finally:
            state.armed = False

    return step


def _gc_switches() -> tuple[Callable[[], None], Callable[[], None]]:
    import gc

    return gc.enable, gc.disable


# -- the dispatch mode -------------------------------------------------------------------


def _make_mode(state: _State, refuse: Callable[..., None]) -> TorchDispatchMode:
    """The one mode every call runs under (its class made here, its state in closures)."""
    category, refused_result = guard_ops.category, guard_ops.refused_result
    poison, same_bytes = guard_ops.poison, guard_ops.same_bytes
    allow, blank, copy = guard_ops.ALLOW, guard_ops.BLANK, guard_ops.COPY
    views: set[Any] = set()  # ops seen to be views: allowed whatever their arguments

    class Guard(TorchDispatchMode):
        # The harness pushes and pops this mode with torch._C's own functions; entering or
        # leaving it any other way is the candidate's doing.
        def __enter__(self) -> Any:
            refuse(TAMPER, "entered or left the sandbox's dispatch mode")

        def __exit__(self, *exc: object) -> None:
            refuse(TAMPER, "entered or left the sandbox's dispatch mode")

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # True would wrap __torch_dispatch__ in a Dynamo guard whose first call imports
            # torch._dynamo: over a second of CPU per candidate (torch.compile is refused).
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
            if func in views:  # the common case first: no argument looked at
                return func(*args, **(kwargs or {}))
            kwargs = kwargs or {}
            kind = category(func, args, kwargs)
            if kind == allow:
                if func.is_view:
                    views.add(func)
                return func(*args, **kwargs)
            if kind == blank:
                result = func(*args, **kwargs)
                return poison(result) if state.plan == "noop" else result
            if kind == copy and state.in_launch and same_bytes(args):
                return func(*args, **kwargs)  # the interpreter moving a kernel's arguments
            what = f"PyTorch computed aten.{func.overloadpacket.__name__} outside a Triton kernel"
            refuse(FORBIDDEN, what, raising=False)
            try:
                return refused_result(func, args, kwargs)
            except guard_ops.ValueRead:
                raise ForbiddenOperation(what) from None

    return Guard()


# -- Triton's launchers --------------------------------------------------------------------


def _wrap_launchers(state: _State, refuse: Callable[..., None], interpreted: bool) -> list[type]:
    """Count launches; skip them in the no-launch call; compile only in the compile pass."""
    from triton.runtime import jit

    classes: list[type] = [jit.JITFunction]
    with contextlib.suppress(ImportError):
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    for cls in classes:
        cls.run = _launcher(vars(cls)["run"], classes, state, refuse)
    with contextlib.suppress(ImportError):
        from triton.runtime.autotuner import Autotuner

        Autotuner.run = _wrap_autotuner(vars(Autotuner)["run"], interpreted, state)
        classes.append(Autotuner)
    return classes


def _launcher(
    run: Callable[..., Any], classes: list[type], state: _State, refuse: Callable[..., None]
) -> Callable[..., Any]:
    def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("warmup"):
            return run(self, *args, **kwargs)
        if type(self) not in classes:
            refuse(TAMPER, "called a Triton launcher on a foreign object")
        state.launches += 1
        state.in_launch += 1
        try:
            if state.plan == "compile":
                _compile_only(run, self, args, kwargs)
                return None
            if state.plan == "noop":  # what a launch returns, with nothing run
                return run(self, *args, **{**kwargs, "warmup": True})
            return run(self, *args, **kwargs)
        finally:
            state.in_launch -= 1

    return launch


def _compile_only(run: Callable[..., Any], fn: Any, args: Any, kwargs: dict[str, Any]) -> None:
    """Compile and load the kernel a launch would run, without running it."""
    try:
        kernel = run(fn, *args, **{**kwargs, "warmup": True})
        load = getattr(kernel, "_init_handles", None)
        if callable(load):
            load()  # the module on the GPU, and the launcher
    except Exception:  # noqa: BLE001 - the real launch that follows reports it
        pass


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


def _wrap_autotuner(
    run: Callable[..., Any], interpreted: bool, state: _State | None = None
) -> Callable[..., Any]:
    """In the compile pass, compile every config the tuner would try and tune nothing;
    under the interpreter (which cannot benchmark), run the first config."""

    def tuned_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if state is None or state.plan != "compile":
            return _untuned_run(self, args, kwargs) if interpreted else run(self, *args, **kwargs)
        try:
            configs = _pruned_configs(self, args, kwargs)
        except Exception:  # noqa: BLE001 - the real launch that follows reports it
            configs = []
        for config in configs:
            with contextlib.suppress(Exception):
                self.fn.run(*args, **kwargs, **config.all_kwargs())
        return None

    return tuned_run


__all__ = [
    "CallReport",
    "ForbiddenOperation",
    "Instruments",
    "Stretch",
    "TamperingDetected",
    "install",
]
