"""The escape hatches `sandbox.guard` shuts while candidate code runs, and its audit hook.

Each hatch is a way out of what the guard's dispatch mode sees: threads (modes are per
thread), raw memory (ctypes, storages, DLPack, pickling, NumPy), ways to step below the
mode (popping it, excluding the Python dispatch key, `redispatch`, `_op_dk`), kernels
registered with PyTorch's dispatcher, compilers other than Triton. Each is replaced, with
every module-level alias of it, by a wrapper that refuses while the guard is armed (the
harness keeps the originals it needs, bound before). The audit hook sees what no wrapper
can (any thread, C-level paths): child processes, sockets, signals, new audit hooks,
profile and trace functions, the garbage collector's object graph, patching the classes
the instruments live in, and files of the grader's in the job directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sandbox.isolation import JOB_TMP_DIR

FORBIDDEN, TAMPER = "torch_fallback", "tampering"
# The GPU's clock registers, as PTX names them (the static gate's `TIMER_REGISTERS`).
TIMER_REGISTERS = r"%\s*(?:globaltimer(?:_lo|_hi)?|clock(?:64|_hi)?)\b"
# (the guard's state: `armed`, `in_launch`; a refusal callback records and raises)
State = Any
Refuse = Callable[..., None]


# -- escape hatches ----------------------------------------------------------------------------

# (owner, attribute names, verdict, why): what candidate code may not call.
_READS = "reads tensor values on the host; compute in a Triton kernel"
_RAW = "reaches raw memory outside PyTorch and Triton"
_MODES = "switches the PyTorch dispatch guard off"
_GRAPHS = "uses CUDA graphs, which replay work no check sees"
_GRAPH_METHODS = ("capture_begin", "capture_end", "replay", "instantiate")
_STREAMS = "switches CUDA streams (a timed run is the work of one stream)"
_SPINS = "spins the GPU outside a Triton kernel"


def _escape_hatches() -> list[tuple[Any, tuple[str, ...], str, str]]:
    import _thread
    import ctypes

    import torch.utils._python_dispatch as python_dispatch
    import torch.utils.dlpack

    hatches: list[tuple[Any, tuple[str, ...], str, str]] = [
        (
            torch.Tensor,
            ("numpy", "__array__", "tolist", "item", "__dlpack__", "__reduce_ex__"),
            FORBIDDEN,
            _READS,
        ),
        (torch.Tensor, ("__repr__", "__str__", "__format__"), FORBIDDEN, _READS),
        (torch.Tensor, ("map_", "map2_", "apply_"), FORBIDDEN, "computes in Python on the host"),
        (torch.Tensor, ("share_memory_",), TAMPER, "shares memory outside the process"),
        (
            torch.UntypedStorage,
            ("tolist", "__getitem__", "__setitem__", "__reduce__"),
            FORBIDDEN,
            _READS,
        ),
        (torch.UntypedStorage, ("_write_file", "from_file", "from_buffer"), FORBIDDEN, _RAW),
        (
            torch.UntypedStorage,
            (
                "_share_filename_cpu_",
                "_share_fd_cpu_",
                "_new_shared_filename_cpu",
                "_new_shared_fd_cpu",
            ),
            TAMPER,
            "shares memory outside the process",
        ),
        (
            torch.TypedStorage,
            ("tolist", "__getitem__", "__setitem__", "__reduce__"),
            FORBIDDEN,
            _READS,
        ),
        (torch.TypedStorage, ("_write_file", "from_file", "from_buffer"), FORBIDDEN, _RAW),
        (torch, ("frombuffer", "from_numpy", "from_file", "from_dlpack", "load"), FORBIDDEN, _RAW),
        (torch.utils.dlpack, ("to_dlpack", "from_dlpack"), FORBIDDEN, _RAW),
        (torch, ("compile",), FORBIDDEN, "torch.compile writes the kernels: write them yourself"),
        (
            ctypes,
            ("cast", "_cast", "memmove", "string_at", "_string_at", "wstring_at"),
            FORBIDDEN,
            _RAW,
        ),
        (threading.Thread, ("start",), FORBIDDEN, "threads are not allowed in a candidate"),
        (threading, ("_start_new_thread",), FORBIDDEN, "threads are not allowed in a candidate"),
        (
            _thread,
            ("start_new_thread", "start_new"),
            FORBIDDEN,
            "threads are not allowed in a candidate",
        ),
        (threading, ("setprofile", "settrace"), TAMPER, "sets a profile or trace function"),
        (
            python_dispatch,
            ("_disable_current_modes", "_pop_mode", "_pop_mode_temporarily", "_push_mode"),
            TAMPER,
            _MODES,
        ),
        (
            torch._C,
            (
                "_pop_torch_dispatch_stack",
                "_push_on_torch_dispatch_stack",
                "_set_dispatch_mode",
                "_unset_dispatch_mode",
                "_DisableTorchDispatch",
                "_ExcludeDispatchKeyGuard",
                "ExcludeDispatchKeyGuard",
                "_ForceDispatchKeyGuard",
                "_IncludeDispatchKeyGuard",
                "_SetExcludeDispatchKeyGuard",
                "_dispatch_tls_set_dispatch_key_excluded",
                "_dispatch_tls_set_dispatch_key_included",
                "_RestorePythonTLSSnapshot",
                "_DisablePythonDispatcher",
                "_EnablePythonDispatcher",
                "_DisableFuncTorch",
                "_AutoDispatchBelowAutograd",
                "_AutoDispatchBelowADInplaceOrView",
                "_push_on_torch_function_stack",
                "_pop_torch_function_stack",
                "DisableTorchFunction",
                "DisableTorchFunctionSubclass",
                "_set_torch_function_state",
                "_dispatch_library",
                "_cuda_jiterator_compile_and_launch_kernel",
            ),
            TAMPER,
            _MODES,
        ),
        (torch._ops.OpOverload, ("redispatch",), TAMPER, _MODES),
        (torch._C._DispatchOperatorHandle, ("redispatch_boxed",), TAMPER, _MODES),
        (torch.ops, ("load_library",), TAMPER, "loads native code"),
        (
            torch.library,
            ("Library", "impl", "custom_op", "register_kernel", "define"),
            TAMPER,
            "registers kernels with PyTorch's dispatcher",
        ),
        (
            torch.cuda,
            ("cudart", "set_per_process_memory_fraction"),
            TAMPER,
            "reaches the CUDA runtime or its GPU memory cap",
        ),
        (
            torch.cuda.memory,
            ("set_per_process_memory_fraction",),
            TAMPER,
            "changes its GPU memory cap",
        ),
        (torch._C, ("_cuda_setMemoryFraction",), TAMPER, "changes its GPU memory cap"),
        # Timing: a timed run is one stream's work between two events, every run checked.
        (torch.cuda.CUDAGraph, _GRAPH_METHODS, TAMPER, _GRAPHS),
        (getattr(torch._C, "_CUDAGraph", None), _GRAPH_METHODS, TAMPER, _GRAPHS),
        (torch.cuda, ("make_graphed_callables",), TAMPER, _GRAPHS),
        (torch.cuda, ("set_stream", "_set_stream_by_id"), TAMPER, _STREAMS),
        (torch._C, ("_cuda_setStream",), TAMPER, _STREAMS),
        (torch.cuda, ("_sleep",), TAMPER, _SPINS),
        (torch._C, ("_cuda_sleep",), TAMPER, _SPINS),
    ]
    with contextlib.suppress(ImportError):
        import torch.cuda.jiterator as jiterator

        hatches.append(
            (
                jiterator,
                ("_create_jit_fn", "_create_multi_output_jit_fn"),
                TAMPER,
                "compiles CUDA code outside Triton",
            )
        )
    return hatches


def wrap_escape_hatches(state: State, refuse: Refuse) -> list[tuple[Any, str, Any]]:
    """Replace each hatch (and every module-level alias of it) with a wrapper that raises
    while candidate code runs. Returns (owner, name, wrapper) for the integrity check."""
    import inspect

    wrapped: list[tuple[Any, str, Any]] = []
    originals: dict[int, tuple[Any, Any]] = {}
    for owner, names, kind, why in _escape_hatches():
        if owner is None:
            continue
        for name in names:
            try:
                static = inspect.getattr_static(owner, name)
            except AttributeError:
                continue
            label = f"{getattr(owner, '__name__', owner)}.{name}"
            wrapper = _blocked(owner, name, static, state, refuse, kind, f"{label} {why}")
            setattr(owner, name, wrapper)
            wrapped.append((owner, name, wrapper))
            originals[id(static)] = (static, wrapper)
    # Modules that imported a hatch by name (`from torch._C import _pop_torch_dispatch_stack`).
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("sandbox") or module is None:
            continue
        try:
            entries = list(vars(module).items())
        except TypeError:
            continue
        for name, value in entries:
            found = originals.get(id(value))
            if found is not None and found[0] is value:
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(module, name, found[1])
                    wrapped.append((module, name, found[1]))
    wrapped += _wrap_compiler(state, refuse)
    return wrapped


def _wrap_compiler(state: State, refuse: Refuse) -> list[tuple[Any, str, Any]]:
    """Triton's `compile`, for candidate kernels: one whose PTX reads the GPU's clocks
    (`%globaltimer`, `%clock`; inline assembly the static gate did not see) is refused, as
    it could tell back-to-back timed calls from trials. (JIT functions pick `compile` up
    from `triton.compiler` when first launched, after this.)"""
    import re

    try:
        import triton.compiler
        import triton.compiler.compiler
    except ImportError:
        return []
    original = triton.compiler.compile
    timer = re.compile(TIMER_REGISTERS)
    what = "compiled a kernel that reads the GPU's clock: it could tell timed calls apart"

    def compile_checked(*args: Any, **kwargs: Any) -> Any:
        kernel = original(*args, **kwargs)
        if state.armed:
            asm = getattr(kernel, "asm", None)
            ptx = asm.get("ptx") if isinstance(asm, dict) else None
            if isinstance(ptx, str) and timer.search(ptx):
                refuse(TAMPER, what)
        return kernel

    wrapped = []
    for owner in (triton.compiler, triton.compiler.compiler, sys.modules.get("triton")):
        if owner is not None and vars(owner).get("compile") is original:
            owner.compile = compile_checked
            wrapped.append((owner, "compile", compile_checked))
    return wrapped


def _blocked(
    owner: Any,
    name: str,
    static: Any,
    state: State,
    refuse: Refuse,
    kind: str,
    what: str,
) -> Any:
    """A stand-in for `owner.name` that refuses while candidate code runs."""
    if (
        isinstance(static, classmethod | staticmethod)
        or type(static).__name__
        in (
            "classmethod_descriptor",
            "builtin_function_or_method",
        )
        and isinstance(owner, type)
    ):
        bound = getattr(owner, name)  # already bound to the class (or static)

        def call_bound(*args: Any, **kwargs: Any) -> Any:
            if state.armed:
                refuse(kind, what)
            return bound(*args, **kwargs)

        return staticmethod(call_bound)

    def blocked(*args: Any, **kwargs: Any) -> Any:
        if state.armed:
            refuse(kind, what)
        return static(*args, **kwargs)

    return blocked


def wrap_dispatch_below(state: State, refuse: Refuse) -> None:
    """`OpOverload._op_dk(key, ...)` runs an op's kernel for one dispatch key, below the
    guard's mode: wrap it on every op made so far and on every op made later (a
    decomposition, which dispatches on through the mode, stays allowed)."""
    decompose = torch._C.DispatchKey.CompositeImplicitAutograd
    what = f"OpOverload._op_dk {_MODES}"

    def wrap(op: Any) -> None:
        below = vars(op).get("_op_dk")
        if below is None or getattr(below, "_guarded", False):
            return

        def guarded(key: Any, *args: Any, **kwargs: Any) -> Any:
            if state.armed and key != decompose:
                refuse(TAMPER, what)
            return below(key, *args, **kwargs)

        guarded._guarded = True  # type: ignore[attr-defined]
        op._op_dk = guarded

    init = torch._ops.OpOverload.__init__

    def init_guarded(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        wrap(self)

    torch._ops.OpOverload.__init__ = init_guarded
    for namespace in list(vars(torch.ops).values()):
        if not isinstance(namespace, torch._ops._OpNamespace):
            continue
        for packet in list(vars(namespace).values()):
            if isinstance(packet, torch._ops.OpOverloadPacket):
                for op in list(vars(packet).values()):
                    if isinstance(op, torch._ops.OpOverload):
                        wrap(op)


# -- the audit hook ------------------------------------------------------------------------------

# Events refused while candidate code runs (the verdict each gets).
_AUDIT_REFUSED = {
    "sys.setprofile": (TAMPER, "sets a profile function"),
    "sys.settrace": (TAMPER, "sets a trace function"),
    "sys._current_frames": (TAMPER, "inspects other threads' frames"),
    "gc.get_objects": (TAMPER, "walks the garbage collector"),
    "gc.get_referrers": (TAMPER, "walks the garbage collector"),
    "gc.get_referents": (TAMPER, "walks the garbage collector"),
    "ctypes.dlopen": (TAMPER, "loads a native library"),
    "ctypes.dlsym": (TAMPER, "looks up native functions"),
    "ctypes.dlsym/handle": (TAMPER, "looks up native functions"),
    "ctypes.cdata": (FORBIDDEN, "reads raw memory through ctypes"),
    "ctypes.cdata/buffer": (FORBIDDEN, "reads raw memory through ctypes"),
    "ctypes.string_at": (FORBIDDEN, "reads raw memory through ctypes"),
    "ctypes.wstring_at": (FORBIDDEN, "reads raw memory through ctypes"),
    "ctypes.PyObj_FromPtr": (TAMPER, "turns an address into an object"),
    "mmap.__new__": (FORBIDDEN, "maps files into memory"),
    "os.kill": (TAMPER, "signals a process"),
    "os.killpg": (TAMPER, "signals a process group"),
    "signal.pthread_kill": (TAMPER, "signals a thread"),
    "socket.__new__": (TAMPER, "opens a socket"),
    "socket.connect": (TAMPER, "opens a connection"),
    "socket.bind": (TAMPER, "binds a socket"),
    "socket.sendto": (TAMPER, "sends on a socket"),
}
_PROCESS_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.exec",
        "os.system",
        "pty.spawn",
    }
)
# What Triton runs while compiling a kernel inside a launch (on a GPU only: the CPU
# interpreter compiles nothing).
_COMPILER_TOOLS = ("ptxas", "gcc", "cc", "clang", "g++", "c++", "ldconfig", "cuobjdump", "nvdisasm")
_C_COMPILERS = ("gcc", "cc", "clang", "g++", "c++")
# Events whose second argument is the new program's argument list.
_ARGV_EVENTS = frozenset({"subprocess.Popen", "os.exec", "os.posix_spawn"})
# The arguments Triton's launcher build gives a C compiler (`triton.runtime.build._build`):
# anything else (`-wrapper`, `-B`, `-fplugin`, `-specs`, `@file`) could run another program.
_C_COMPILER_ARG = re.compile(
    r"(?:-O[0-3s]|-shared|-fPIC|-Wno-psabi|-o|-l:?[\w.+-]+|-[LI]/[^\s]*|[^-@][^\s]*)\Z"
)
# Attributes of the instruments' classes whose replacement would run candidate code in the
# harness's place, or take an instrument away.
_DANGEROUS_DUNDERS = frozenset(
    {
        "__torch_function__",
        "__torch_dispatch__",
        "__del__",
        "__getattribute__",
        "__getattr__",
        "__setattr__",
        "__delattr__",
        "__init_subclass__",
        "__new__",
        "__init__",
        "__class__",
    }
)
_FUNCTION_INTERNALS = frozenset({"__code__"})
_PROC_MEMORY = frozenset({"mem", "pagemap"})
# Frames: the candidate's own lead to the harness's (`f_back`), whose loop and clock are
# not its to see. The events a frame read raises (`sys._getframe`, these attributes) are
# refused where the reader is the candidate's code, or a frame walker it called directly.
_CANDIDATE_SOURCE = "candidate.py"
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
_FRAMES_LOOKED_AT = 2  # the reader and its caller: a frame walker the candidate calls
# What in the job directory candidate code may open (its source, its bytecode, Triton's
# cache, its TMPDIR; a folder's files too); the rest is the grader's (the exchange files).
_OWN_FILES = (_CANDIDATE_SOURCE,)
_OWN_FOLDERS = ("__pycache__", ".triton", JOB_TMP_DIR)


def protected_names(
    launcher_classes: list[type], wrapped: list[tuple[Any, str, Any]]
) -> dict[int, frozenset[str]]:
    """For each class the audit hook guards: the attributes it may not have set."""
    import multiprocessing.connection

    names: dict[int, set[str]] = {}
    for owner, name, _ in wrapped:
        if isinstance(owner, type):
            names.setdefault(id(owner), set()).add(name)
    for cls in launcher_classes:
        names.setdefault(id(cls), set()).add("run")
    for cls in (
        torch.Tensor,
        torch.UntypedStorage,
        torch.TypedStorage,
        torch._ops.OpOverload,
        TorchDispatchMode,
        threading.Thread,
        multiprocessing.connection.Connection,
    ):
        names.setdefault(id(cls), set()).update(_DANGEROUS_DUNDERS)
    return {key: frozenset(value) for key, value in names.items()}


def add_audit_hook(
    state: State,
    refuse: Refuse,
    protected: dict[int, frozenset[str]],
    home: str,
    compiles: bool = True,
) -> None:
    """`home`: the job directory (the working directory when the guard is installed),
    whose files besides the candidate's source are the grader's. `compiles`: whether a
    launch may run Triton's compilers (not under the CPU interpreter)."""
    basename, realpath, join = os.path.basename, os.path.realpath, os.path.join
    refused, process_events, tools = _AUDIT_REFUSED, _PROCESS_EVENTS, _COMPILER_TOOLS
    home = realpath(home) + os.sep
    own_files = frozenset(join(home, name) for name in _OWN_FILES)
    own_folders = tuple(join(home, name) for name in _OWN_FOLDERS)
    own_inside = tuple(folder + os.sep for folder in own_folders)

    def graders(path: str) -> bool:
        """Whether `path` (real) is in the job directory and not the candidate's."""
        if not path.startswith(home) or path in own_files or path in own_folders:
            return False
        return not path.startswith(own_inside)

    candidate_file = join(home, _CANDIDATE_SOURCE)
    frame_attributes = _FRAME_ATTRIBUTES
    getframe = sys._getframe
    real_paths: dict[str, str] = {}
    inside = [False]  # the hook's own frame reads raise events of their own

    def called_from_candidate() -> bool:
        """Whether one of the few frames nearest the event is the candidate's code."""
        inside[0] = True
        try:
            frame = getframe(2)  # this function's, the hook's, then the event's caller
            for _ in range(_FRAMES_LOOKED_AT):
                if frame is None:
                    return False
                name = frame.f_code.co_filename
                path = real_paths.get(name)
                if path is None:
                    path = real_paths[name] = realpath(name)
                if path == candidate_file:
                    return True
                frame = frame.f_back
            return False
        finally:
            inside[0] = False

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "sys.addaudithook":
            if state.armed:
                refuse(TAMPER, "added an audit hook", raising=False)
            raise RuntimeError("audit hooks are the sandbox's")  # refuses the new hook
        if not state.armed:
            return
        found = refused.get(event)
        if found is not None:
            refuse(found[0], f"{event}: the candidate {found[1]}")
        elif event in ("object.__setattr__", "object.__delattr__"):
            target, name = args[0], args[1]
            if name in _FUNCTION_INTERNALS or name in protected.get(id(target), ()):
                refuse(TAMPER, f"replaced {getattr(target, '__name__', '?')}.{name}")
        elif event in process_events:
            if compiles and state.in_launch and _is_compiler_call(event, args, tools):
                return  # Triton's compiler, inside a launch
            refuse(TAMPER, f"{event}: the candidate starts another program")
        elif event == "open" and isinstance(args[0], str | bytes):
            path = realpath(os.fsdecode(args[0]))
            if graders(path):
                name = path[len(home) :][:200]
                refuse(FORBIDDEN, f"opened a file of the grader's in its job directory: {name}")
            if path.startswith("/proc/") and basename(path) in _PROC_MEMORY:
                refuse(FORBIDDEN, "opened a process's memory as a file")
        elif event == "os.chdir":
            refuse(TAMPER, "changed its working directory")
        elif (
            (
                event == "sys._getframe"
                or (event == "object.__getattr__" and args[1] in frame_attributes)
            )
            and not inside[0]
            and not state.in_launch
            and called_from_candidate()
        ):
            # From a frame, `f_back` leads to the harness's: its loop, its clock.
            refuse(TAMPER, f"{event}: the candidate reads the call stack's frames")

    sys.addaudithook(hook)


def _is_compiler_call(event: str, args: tuple[Any, ...], tools: tuple[str, ...]) -> bool:
    """Whether a process event starts one of Triton's compilers straight from an argument
    list (never through a shell), a C compiler only with the arguments Triton's launcher
    build gives it."""
    if event not in _ARGV_EVENTS or len(args) < 2 or not isinstance(args[1], list | tuple):
        return False
    name = os.path.basename(_program(event, args))
    if not name.startswith(tools):
        return False
    if not name.startswith(_C_COMPILERS):
        return True
    return all(isinstance(arg, str) and _C_COMPILER_ARG.match(arg) for arg in args[1][1:])


def _program(event: str, args: tuple[Any, ...]) -> str:
    """The program an audited process event starts ('' when it names none)."""
    program: Any = args[0] if args else None
    if event == "subprocess.Popen" and program is None and len(args) > 1:
        argv = args[1]
        program = argv if isinstance(argv, str | bytes) else (list(argv) or [None])[0]
    if isinstance(program, bytes | str | os.PathLike):
        return os.fsdecode(program)
    return ""
