"""The candidate process: one untrusted candidate, then exit.

Forked by the grader's zygote (`sandbox.zygote`, which has imported torch and Triton
already) into fresh namespaces, it jails itself, installs the instruments of
`sandbox.guard`, says "ready", then obeys the grader's commands on a private pipe:
load the candidate, run it on inputs read from files the grader owns, write the
outputs back into the grader's files, time it. Replies are JSON (the grader never
unpickles anything from this process). Nothing here decides a verdict: the grader
compares and judges.

Every stretch of candidate code (its import, each call, each timed loop) runs inside
`sandbox.guard`'s instruments, which report what it did. After a call the harness touches
what came back only through functions bound before the candidate was imported (the
C-level tensor methods, not attributes of `torch.Tensor` a candidate may have replaced),
accepts only a plain list or tuple of plain tensors, and never calls the candidate's
objects (their `__iter__`, `__len__` or `__del__` would run unguarded).
"""

from __future__ import annotations

import errno
import gc
import importlib.util
import json
import os
import re
import socket
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from sandbox import isolation
from sandbox.timed_harness import timing_commands
from sandbox.transfer import numel_of, receive_descriptors

MAX_MESSAGE = 4000
# Triton's autotuner times each config for 25 ms of warm-up and 100 ms of runs; here
# 5 + 20, so that tuning eight configs fits in a trial's lease on the GPU (the grader's
# SHARED_LEASE_S) instead of spilling onto the GPU beside other jobs' timed loops.
AUTOTUNE_WARMUP_MS = 5
AUTOTUNE_REP_MS = 20


def _shorten_autotuning(active_driver: Any) -> None:
    """Make autotuners that bring no benchmarker of their own tune on a shorter budget."""
    import functools

    import triton.testing

    bench = functools.partial(
        triton.testing.do_bench, warmup=AUTOTUNE_WARMUP_MS, rep=AUTOTUNE_REP_MS
    )
    if hasattr(active_driver, "get_benchmarker"):
        active_driver.get_benchmarker = lambda: bench


def _tail(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


_SIZE_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def oom_from_full_gpu(message: str, held: int, free: int, cap: int) -> bool:
    """Whether a CUDA out-of-memory `message` is the GPU's fault rather than the cap's.

    True when the failed request fitted under the cap beside what the process `held`,
    but the device had less `free`: a shared GPU that others filled.
    """
    asked = re.search(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)\b", message)
    if "CUDA out of memory" not in message or asked is None:
        return False
    request = float(asked[1]) * _SIZE_UNITS[asked[2]]
    return held + request <= cap and request > free


class Harness:
    def __init__(self, conn: Connection, device: str, job_dir: str) -> None:
        import torch

        from sandbox import guard

        self.torch = torch
        self.guard = guard
        self.conn = conn
        # Bound before the candidate is imported (and before the guard wraps the escape
        # hatches): the harness's own steps never look these up again.
        base = torch._C.TensorBase
        self._from_file = torch.from_file
        self._copy = base.copy_
        self._detach = base.detach
        self._view = base.view
        self._size = base.size
        self._dtype = base.dtype.__get__
        self._numel = base.numel
        self._storage_ptr = lambda t: torch._C.StorageBase.data_ptr(base.untyped_storage(t))
        self._to = base.to
        self._empty = torch.empty
        self._tensor_type = torch.Tensor
        self._type_name = type.__dict__["__name__"].__get__
        self._dumps = json.dumps
        self._perf = time.perf_counter
        self._send = conn.send_bytes
        self._recv = conn.recv
        self._close = os.close
        self._fileno = conn.fileno()
        self.device = device
        self.job_dir = job_dir
        self.entry: Any = None
        self.seq: int | None = None  # of the command being served
        self.received = 0.0  # when it came (perf_counter), for the grader's stage accounting
        self.clock = None
        self.gpu_cap: int | None = None  # bytes of GPU memory this candidate may take
        self.fds: list[int] = []  # shared device buffers that came with the current command
        self._shared_buffer: Any = None
        # When each start-up step ended (the host's monotonic clock, which the grader shares):
        # what a process spends before it is ready, reported with "ready".
        self.startup: dict[str, float] = {}
        # Bound before the instruments wrap `torch.cuda.cudart` (a hatch the candidate must
        # not use): the harness's own out-of-memory check asks the runtime for free memory.
        self._cudart = torch.cuda.cudart
        self.instruments = guard.install(device)
        if device == "cuda":
            from sandbox.device_share import SharedBuffer

            self._shared_buffer = SharedBuffer
            from sandbox import launchers

            launchers.install_candidate_hook(self.ask)
            from triton.runtime import driver

            from sandbox.timing import SPIN_RATE_ENV, bind_clock

            torch.cuda.init()
            torch.cuda.synchronize()  # the context itself: made by the first call that needs it
            self.startup["cuda_init"] = time.monotonic()
            spin_rate = os.environ.get(SPIN_RATE_ENV)
            self.clock = bind_clock(float(spin_rate) if spin_rate else None)
            self.startup["clock"] = time.monotonic()
            driver.active.utils  # noqa: B018 - loads (or builds) the driver helpers now
            _shorten_autotuning(driver.active)
            self.startup["triton"] = time.monotonic()
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        # The timing commands, bound now, before any candidate code (`sandbox.timed_harness`).
        self.timing = timing_commands(self)

    # -- plumbing -----------------------------------------------------------------
    def reply(self, **payload: Any) -> None:
        """Answer the command in flight (the grader matches replies by `seq`)."""
        self._send(self._dumps({**payload, "seq": self.seq}).encode())

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """A question to the grader in the middle of a command (`sandbox.launchers`)."""
        self._send(self._dumps(request).encode())
        answer = self._recv()
        return answer if isinstance(answer, dict) else {}

    def classify(self, error: BaseException) -> str:
        """The verdict a failure of the candidate's own code gets."""
        from sandbox.guard import ForbiddenOperation, TamperingDetected

        name = type(error).__name__
        text_of_error = str(error)
        if isinstance(error, ForbiddenOperation):
            return "torch_fallback"
        if isinstance(error, TamperingDetected):
            return "tampering"
        if (
            isinstance(error, MemoryError)
            or name == "OutOfMemoryError"
            or "can't allocate memory" in text_of_error
            or "Cannot allocate memory" in text_of_error
        ) or (
            isinstance(error, OSError) and error.errno in (errno.EFBIG, errno.ENOSPC, errno.EDQUOT)
        ):
            return "gpu_full" if self._gpu_was_full(text_of_error) else "resource_limit"
        if "CompilationError" in name or "CompileTimeAssertionFailure" in name:
            return "compile_error"
        return "runtime_error"

    def fail(self, error: BaseException) -> None:
        """Answer with a failure of the harness's own steps (files, copies, memory)."""
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        self.reply(
            ok=False,
            error_type=self.classify(error),
            message=_tail(f"{type(error).__name__}: {error}\n{text}"),
        )

    def refused(self, report: Any, default: str = "runtime_error") -> bool:
        """Answer with the failure a guarded stretch reports, if any; whether it did."""
        failure = report.failure()
        if failure is None:
            return False
        kind, message = failure
        self.reply(ok=False, error_type=kind or default, message=_tail(message))
        return True

    def _gpu_was_full(self, message: str) -> bool:
        """Whether a CUDA out-of-memory error came from other processes, not this cap."""
        if self.device != "cuda" or self.gpu_cap is None:
            return False
        free, _ = self._cudart().cudaMemGetInfo(self.torch.cuda.current_device())
        return oom_from_full_gpu(message, self.torch.cuda.memory_reserved(), free, self.gpu_cap)

    def _tensor(self, spec: dict[str, Any], shared: bool) -> Any:
        torch = self.torch
        if "value" in spec:
            return spec["value"]
        dtype = getattr(torch, spec["dtype"])
        numel = numel_of(spec)
        if numel == 0:
            return self._empty(spec["shape"], dtype=dtype)
        if "fd_index" in spec:  # the grader's device memory, mapped here
            fd = self.fds[spec["fd_index"]]
            buffer = self._shared_buffer.open(fd, spec["size"], self.torch.cuda.current_device())
            return buffer.tensor(dtype, spec["shape"])
        if "path" not in spec:  # shape only: memory on the device, never written
            return self._empty(spec["shape"], dtype=dtype, device=self.device)
        flat = self._from_file(spec["path"], shared=shared, size=numel, dtype=dtype)
        return self._view(flat, spec["shape"])

    def _inputs(self, specs: list[dict[str, Any]]) -> list[Any]:
        """The inputs on the device: the grader's shared memory itself, or private copies.

        A file is copied once, straight from its mapping (the grader judges mutation
        from what the candidate leaves in its `inputs_after` files, not from these). In
        shared memory the candidate runs on the grader's copy, which the grader checks.
        """
        tensors = [self._tensor(s, shared=False) for s in specs]
        return [
            self._to(t, self.device, copy=True)
            if type(t) is self._tensor_type and "path" in spec
            else t
            for t, spec in zip(tensors, specs, strict=True)
        ]

    def _sync(self) -> None:
        if self.clock is not None:
            self.clock.synchronize()

    def _settle(self) -> None:
        """Finish this process's copies into the grader's memory before replying.

        The grader reads shared device memory as soon as the reply comes; its stream is
        not ordered after this process's.
        """
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def _call(self, inputs: list[Any]) -> Any:
        return self.entry(*inputs)

    # -- commands -----------------------------------------------------------------
    def probe(self, msg: dict[str, Any]) -> None:
        with open("/proc/self/status") as status:
            caps = next(line for line in status if line.startswith("CapEff:"))
        report: dict[str, Any] = {
            "uid": os.getuid(),
            "pid": os.getpid(),
            "capabilities": int(caps.split()[1], 16) != 0,
            "gc_frozen": gc.get_freeze_count(),  # objects inherited from the zygote, not walked
        }
        try:
            with open(msg["outside_path"], "w") as handle:
                handle.write("escaped")
            report["wrote_outside"] = True
        except OSError:
            report["wrote_outside"] = False
        try:
            with socket.create_connection(("127.0.0.1", msg["port"]), timeout=2):
                report["connected"] = True
        except OSError:
            report["connected"] = False
        self.reply(ok=True, **report)

    def _cap_gpu_memory(self, limit: int | None) -> None:
        """Hold the candidate's PyTorch allocations on the GPU to `limit` bytes."""
        torch = self.torch
        if self.device != "cuda" or not limit:
            return
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total))
        self.gpu_cap = limit

    def load(self, msg: dict[str, Any]) -> None:
        """Import the candidate and find (or build) its entry point, guarded: escape
        hatches shut, PyTorch allowed (a ModelNew sets its parameters up)."""
        self._cap_gpu_memory(msg.get("gpu_memory_bytes"))
        imported = self.instruments.loading(lambda error: "compile_error")
        with imported:
            module = self._import(msg["path"])
        if self.refused(imported.report):
            return
        built = self.instruments.loading(self.classify)
        with built:
            entry, missing = self._entry_point(module, msg)
        if self.refused(built.report):
            return
        # Whatever the import queued on the GPU ends before the grader hears back: the
        # grader holds its share of the GPU gate until then (no kernel left spinning
        # beside another job's timed loop or baselines).
        self._settle()
        if missing:
            self.reply(ok=False, error_type="no_entry_point", message=missing)
            return
        self.entry = entry
        self.reply(ok=True)

    @staticmethod
    def _import(path: str) -> Any:
        spec = importlib.util.spec_from_file_location("candidate", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["candidate"] = module
        spec.loader.exec_module(module)
        return module

    def _entry_point(self, module: Any, msg: dict[str, Any]) -> tuple[Any, str]:
        """(entry, '') or (None, why there is none); runs guarded (a module's __getattr__
        is the candidate's code)."""
        if msg["format"] == "kernelbench":
            model_cls = getattr(module, "ModelNew", None)
            if model_cls is None:
                return None, "no class ModelNew"
            self.torch.manual_seed(msg["init_seed"])
            return model_cls(*msg["init_inputs"]).to(self.device), ""
        entry = getattr(module, "triton_fused_operator", None)
        return (entry, "") if callable(entry) else (None, "no triton_fused_operator")

    def run(self, msg: dict[str, Any]) -> None:
        """One call of the candidate under the guard (`msg["mode"]`: normal, noop or
        compile), its outputs copied into the grader's buffers."""
        plan = msg["mode"]
        if plan == "compile":  # nothing runs: inputs need a shape, not data
            inputs = [self._tensor(s, shared=False) for s in msg["inputs"]]
        else:
            inputs = self._inputs(msg["inputs"])
        inputs_s = self._perf() - self.received
        call = self.instruments.call(plan, self.classify)
        del plan  # kept by the guard only
        result: Any = None
        with call:
            call.hold(inputs)
            called = self._perf()
            result = self._call(inputs)
            self._sync()
            call_s = self._perf() - called
            call.hold(result)
        if self.refused(call.report):
            return
        copied = self._perf()
        described = self._outputs(result, inputs, msg)
        if described is None:
            return
        count, outputs = described
        self.reply(
            ok=True,
            launches=call.report.launches,
            count=count,
            outputs=outputs,
            # As this process measured them, for the grader's stage accounting only.
            call_s=call_s,
            inputs_s=inputs_s,
            outputs_s=self._perf() - copied,
            harness_s=self._perf() - self.received,
        )

    def _outputs(
        self, result: Any, inputs: list[Any], msg: dict[str, Any]
    ) -> tuple[int, list[dict[str, Any]]] | None:
        """Copy what the call returned (and, on trials, the inputs as it left them) into
        the grader's buffers: how many outputs it returned, and each one described.
        None: already answered."""
        tensor = self._tensor_type
        if type(result) is tensor:
            result = [result]
        if type(result) not in (list, tuple):
            self.reply(
                ok=False,
                error_type="wrong_output",
                message=f"returned {self._type_name(type(result))}, expected a list of tensors",
            )
            return None
        input_ptrs = {self._storage_ptr(t) for t in inputs if type(t) is tensor and self._numel(t)}
        outputs = []
        # The grader's buffers, kept until the copies into them are done: letting go of a
        # shared buffer waits for the device, once for all of them after `_settle`.
        targets = []
        for value, spec in zip(result, msg["outputs"], strict=False):
            info: dict[str, Any] = {"type": self._type_name(type(value)), "written": False}
            if type(value) is not tensor:
                outputs.append(info)
                continue
            numel = self._numel(value)
            info["shape"] = list(self._size(value))
            info["dtype"] = str(self._dtype(value)).removeprefix("torch.")
            info["aliases_input"] = bool(numel and self._storage_ptr(value) in input_ptrs)
            if info["shape"] == spec["shape"] and info["dtype"] == spec["dtype"]:
                if numel:
                    targets.append(self._tensor(spec, shared=True))
                    self._copy(targets[-1], self._detach(value))
                info["written"] = True
            outputs.append(info)
        # The inputs as the candidate left them: the grader compares them itself (shared
        # memory is the grader's own copy, which the candidate ran on: nothing to write).
        for now, spec in zip(inputs, msg.get("inputs_after", []), strict=False):
            if "path" not in spec or type(now) is not tensor or not self._numel(now):
                continue
            if list(self._size(now)) == spec["shape"]:
                targets.append(self._tensor(spec, shared=True))
                self._copy(targets[-1], self._detach(now))
        self._settle()
        del targets
        return len(result), outputs

    def memory(self, msg: dict[str, Any]) -> None:
        """The most GPU memory this process's allocator held (statistics for the grader)."""
        peak = self.torch.cuda.max_memory_allocated() if self.clock is not None else 0
        self.reply(ok=True, peak_bytes=int(peak))

    def ping(self, msg: dict[str, Any]) -> None:
        """An empty round trip: the grader subtracts its cost from the host-clock timing."""
        self.reply(ok=True)

    def serve(self) -> None:
        handlers = {
            "probe": self.probe,
            "load": self.load,
            "run": self.run,
            **self.timing,
            "ping": self.ping,
            "memory": self.memory,
        }
        while True:
            try:
                msg = self._recv()
            except EOFError:
                return
            self.received = self._perf()
            if msg["cmd"] == "exit":
                return
            self.seq = msg.get("seq")
            try:
                if msg.get("fds"):
                    self.fds = receive_descriptors(self._fileno, int(msg["fds"]))
                handlers[msg["cmd"]](msg)
            except Exception as error:  # noqa: BLE001 - the harness's own steps (files, copies)
                # Staging a GiB input or writing an output can fail (memory, disk): the
                # grader gets a verdict with the reason instead of a process that vanished.
                self.fail(error)
            finally:
                for fd in self.fds:  # each mapping holds its memory; the descriptors can go
                    self._close(fd)
                self.fds = []


def serve(fd: int, job_dir: str, device: str, processes: int) -> None:
    """Jail this process, say ready, obey the grader on pipe `fd`, then exit."""
    began = time.monotonic()
    missing = isolation.enter_jail(job_dir, processes, device=device)
    os.chdir(job_dir)
    jailed = time.monotonic()
    conn = Connection(fd)
    harness = Harness(conn, device, job_dir)
    missing += isolation.lock_down()  # the syscall filter: last, before any candidate code
    startup = {"serve": began, "jail": jailed, **harness.startup, "ready": time.monotonic()}
    harness.reply(ok=True, ready=True, jail_missing=missing, startup=startup)
    harness.serve()
    sys.stdout.flush()
    os._exit(0)
