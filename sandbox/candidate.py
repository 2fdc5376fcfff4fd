"""The candidate process: one untrusted candidate, then exit.

Forked by the grader's zygote (`sandbox.zygote`, which has imported torch and Triton
already) into fresh namespaces, it jails itself, installs the instruments of
`sandbox.guard`, says "ready", then obeys the grader's commands on a private pipe:
load the candidate, run it on inputs read from files the grader owns, write the
outputs back into the grader's files, time it. Replies are JSON (the grader never
unpickles anything from this process). Nothing here decides a verdict: the grader
compares and judges.
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
        self.device = device
        self.job_dir = job_dir
        self.entry: Any = None
        self.seq: int | None = None  # of the command being served
        self.received = 0.0  # when it came (perf_counter), for the grader's stage accounting
        self.staged: list[Any] = []
        self.timed: dict[str, Any] = {}
        self.clock = None
        self.gpu_cap: int | None = None  # bytes of GPU memory this candidate may take
        # Bound before the candidate is imported: its patches cannot reach these.
        self._from_file = torch.from_file
        self._copy = torch.Tensor.copy_
        self._empty = torch.empty
        self.fds: list[int] = []  # shared device buffers that came with the current command
        self._shared_buffer: Any = None
        # When each start-up step ended (the host's monotonic clock, which the grader shares):
        # what a process spends before it is ready, reported with "ready".
        self.startup: dict[str, float] = {}
        guard.install()
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

    # -- plumbing -----------------------------------------------------------------
    def reply(self, **payload: Any) -> None:
        """Answer the command in flight (the grader matches replies by `seq`)."""
        self.conn.send_bytes(json.dumps({**payload, "seq": self.seq}).encode())

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """A question to the grader in the middle of a command (`sandbox.launchers`)."""
        self.conn.send_bytes(json.dumps(request).encode())
        answer = self.conn.recv()
        return answer if isinstance(answer, dict) else {}

    def fail(self, error: BaseException) -> None:
        from sandbox.guard import ForbiddenOperation, TamperingDetected

        kind = "runtime_error"
        name = type(error).__name__
        text_of_error = str(error)
        if isinstance(error, ForbiddenOperation):
            kind = "torch_fallback"
        elif isinstance(error, TamperingDetected):
            kind = "tampering"
        elif (
            (
                isinstance(error, MemoryError)
                or name == "OutOfMemoryError"
                or "can't allocate memory" in text_of_error
                or "Cannot allocate memory" in text_of_error
            )
            or isinstance(error, OSError)
            and error.errno == errno.EFBIG
        ):
            kind = "gpu_full" if self._gpu_was_full(text_of_error) else "resource_limit"
        elif "CompilationError" in name or "CompileTimeAssertionFailure" in name:
            kind = "compile_error"
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        self.reply(ok=False, error_type=kind, message=_tail(f"{name}: {error}\n{text}"))

    def _gpu_was_full(self, message: str) -> bool:
        """Whether a CUDA out-of-memory error came from other processes, not this cap."""
        if self.device != "cuda" or self.gpu_cap is None:
            return False
        free, _ = self.torch.cuda.mem_get_info()
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
        return flat.view(spec["shape"])

    def _inputs(self, specs: list[dict[str, Any]]) -> list[Any]:
        """The inputs on the device: the grader's shared memory itself, or private copies.

        A file is copied once, straight from its mapping (the grader judges mutation
        from what the candidate leaves in its `inputs_after` files, not from these). In
        shared memory the candidate runs on the grader's copy, which the grader checks.
        """
        tensors = [self._tensor(s, shared=False) for s in specs]
        return [
            t.to(self.device, copy=True)
            if isinstance(t, self.torch.Tensor) and "path" in spec
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
        torch = self.torch
        self._cap_gpu_memory(msg.get("gpu_memory_bytes"))
        try:
            spec = importlib.util.spec_from_file_location("candidate", msg["path"])
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules["candidate"] = module
            self.guard._state.candidate_running = True
            try:
                spec.loader.exec_module(module)
            finally:
                self.guard._state.candidate_running = False
        except BaseException as error:  # noqa: BLE001 - any failure at import is the kernel's
            kind = "compile_error"
            if isinstance(error, self.guard.TamperingDetected):
                kind = "tampering"  # e.g. lifting its GPU memory cap at import
            elif isinstance(error, self.guard.ForbiddenOperation):
                kind = "torch_fallback"
            self.reply(ok=False, error_type=kind, message=_tail(traceback.format_exc()))
            return
        if msg["format"] == "kernelbench":
            model_cls = getattr(module, "ModelNew", None)
            if model_cls is None:
                self.reply(ok=False, error_type="no_entry_point", message="no class ModelNew")
                return
            try:
                torch.manual_seed(msg["init_seed"])
                model = model_cls(*msg["init_inputs"])
                self.entry = model.to(self.device)
            except BaseException as error:  # noqa: BLE001
                self.fail(error)
                return
        else:
            entry = getattr(module, "triton_fused_operator", None)
            if not callable(entry):
                self.reply(
                    ok=False, error_type="no_entry_point", message="no triton_fused_operator"
                )
                return
            self.entry = entry
        self.reply(ok=True)

    def run(self, msg: dict[str, Any]) -> None:
        torch = self.torch
        if msg["mode"] == "compile":  # nothing runs: inputs need a shape, not data
            inputs = [self._tensor(s, shared=False) for s in msg["inputs"]]
        else:
            inputs = self._inputs(msg["inputs"])
        inputs_s = time.perf_counter() - self.received
        call = self.guard.candidate_call(msg["mode"])
        tampered = None
        try:
            with call:
                called = time.perf_counter()
                result = self._call(inputs)
                self._sync()
                call_s = time.perf_counter() - called
                tampered = self.guard.intact(call.poison)
        except BaseException as error:  # noqa: BLE001 - reported, judged by the grader
            if isinstance(error, SystemExit | KeyboardInterrupt):
                error = RuntimeError(f"{type(error).__name__} raised by the candidate")
            self.fail(error)
            return
        launches = self.guard.launches
        copied = time.perf_counter()
        if tampered:
            self.reply(ok=False, error_type="tampering", message=tampered)
            return
        if isinstance(result, torch.Tensor):
            result = [result]
        if not isinstance(result, list | tuple):
            self.reply(
                ok=False,
                error_type="wrong_output",
                message=f"returned {type(result).__name__}, expected a list of tensors",
            )
            return
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        input_ptrs = {t.untyped_storage().data_ptr() for t in tensors if t.numel()}
        outputs = []
        # The grader's buffers, kept until the copies into them are done: letting go of a
        # shared buffer waits for the device, once for all of them after `_settle`.
        targets = []
        for value, spec in zip(result, msg["outputs"], strict=False):
            info: dict[str, Any] = {"type": type(value).__name__, "written": False}
            if type(value) is not torch.Tensor:
                outputs.append(info)
                continue
            info["shape"] = list(value.shape)
            info["dtype"] = str(value.dtype).removeprefix("torch.")
            info["aliases_input"] = bool(
                value.numel() and value.untyped_storage().data_ptr() in input_ptrs
            )
            if info["shape"] == spec["shape"] and info["dtype"] == spec["dtype"]:
                if value.numel():
                    targets.append(self._tensor(spec, shared=True))
                    self._copy(targets[-1], value.detach())
                info["written"] = True
            outputs.append(info)
        # The inputs as the candidate left them: the grader compares them itself (shared
        # memory is the grader's own copy, which the candidate ran on: nothing to write).
        for now, spec in zip(inputs, msg.get("inputs_after", []), strict=False):
            if "path" not in spec:
                continue
            if isinstance(now, torch.Tensor) and now.numel() and list(now.shape) == spec["shape"]:
                targets.append(self._tensor(spec, shared=True))
                self._copy(targets[-1], now.detach())
        self._settle()
        del targets
        self.reply(
            ok=True,
            launches=launches,
            count=len(result),
            outputs=outputs,
            # As this process measured them, for the grader's stage accounting only.
            call_s=call_s,
            inputs_s=inputs_s,
            outputs_s=time.perf_counter() - copied,
            harness_s=time.perf_counter() - self.received,
        )

    def time(self, msg: dict[str, Any]) -> None:
        from sandbox.timing import time_cuda, time_wall

        if self.clock is None:
            self.reply(ok=False, error_type="sandbox_error", message="timing needs CUDA")
            return
        inputs = self.staged
        box: list[Any] = []
        # One set of outputs per kept loop and one in flight: a loop timed again drops
        # its earlier outputs, and each call's are freed before the next one allocates
        # (as the grader's baseline loops do), within the GPU memory cap of 3x the I/O.
        self.timed.pop(msg.get("slot", "events"), None)

        def step() -> None:
            box.clear()
            box.append(self._call(inputs))

        started = time.perf_counter()
        try:
            with self.guard.candidate_call("normal"):
                if msg.get("wall"):
                    times = [time_wall(step, self.clock, msg["runs"])]
                else:
                    times = time_cuda(step, self.clock, msg["runs"], msg["warmup"])
        except BaseException as error:  # noqa: BLE001
            self.fail(error)
            return
        # Kept for `fetch`, which copies them out after the grader's clock has stopped.
        self.timed[msg.get("slot", "events")] = box[0] if box else []
        # The loop's own duration, for the grader's stage accounting only (never trusted).
        self.reply(ok=True, times=times, loop_s=time.perf_counter() - started)

    def fetch(self, msg: dict[str, Any]) -> None:
        """Write the outputs of the last call of each timed loop into the grader's files."""
        targets = []  # held until the copies are done (see `run`)
        for slot, specs in msg["outputs"].items():
            result = self.timed.get(slot, [])
            if isinstance(result, self.torch.Tensor):
                result = [result]
            if not isinstance(result, list | tuple):
                continue
            for value, spec in zip(result, specs, strict=False):
                if (
                    type(value) is self.torch.Tensor
                    and list(value.shape) == spec["shape"]
                    and value.numel()
                ):
                    targets.append(self._tensor(spec, shared=True))
                    self._copy(targets[-1], value.detach())
        self._settle()
        del targets
        self.reply(ok=True)

    def memory(self, msg: dict[str, Any]) -> None:
        """The most GPU memory this process's allocator held (statistics for the grader)."""
        peak = self.torch.cuda.max_memory_allocated() if self.clock is not None else 0
        self.reply(ok=True, peak_bytes=int(peak))

    def ping(self, msg: dict[str, Any]) -> None:
        """An empty round trip: the grader subtracts its cost from the host-clock timing."""
        self.reply(ok=True)

    def stage(self, msg: dict[str, Any]) -> None:
        """Put timing inputs on the device ahead of `time`, outside the grader's clock."""
        self.staged = self._inputs(msg["inputs"])
        self._sync()
        self.reply(ok=True)

    def serve(self) -> None:
        handlers = {
            "probe": self.probe,
            "load": self.load,
            "run": self.run,
            "stage": self.stage,
            "time": self.time,
            "fetch": self.fetch,
            "ping": self.ping,
            "memory": self.memory,
        }
        while True:
            try:
                msg = self.conn.recv()
            except EOFError:
                return
            self.received = time.perf_counter()
            if msg["cmd"] == "exit":
                return
            self.seq = msg.get("seq")
            try:
                if msg.get("fds"):
                    self.fds = receive_descriptors(self.conn.fileno(), int(msg["fds"]))
                handlers[msg["cmd"]](msg)
            except Exception as error:  # noqa: BLE001 - the harness's own steps (files, copies)
                # Staging a GiB input or writing an output can fail (memory, disk): the
                # grader gets a verdict with the reason instead of a process that vanished.
                self.fail(error)
            finally:
                for fd in self.fds:  # each mapping holds its memory; the descriptors can go
                    os.close(fd)
                self.fds = []


def serve(fd: int, job_dir: str, device: str, processes: int) -> None:
    """Jail this process, say ready, obey the grader on pipe `fd`, then exit."""
    began = time.monotonic()
    missing = isolation.enter_jail(job_dir, processes)
    os.chdir(job_dir)
    jailed = time.monotonic()
    conn = Connection(fd)
    harness = Harness(conn, device, job_dir)
    startup = {"serve": began, "jail": jailed, **harness.startup, "ready": time.monotonic()}
    harness.reply(ok=True, ready=True, jail_missing=missing, startup=startup)
    harness.serve()
    sys.stdout.flush()
    os._exit(0)
