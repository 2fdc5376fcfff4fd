"""The GPU as one grader shares it with the others on its host: holds and memory.

Holds of the host-wide gate (`sandbox.gpu_gate`): correctness work shares the GPU, a
timed loop has it alone. Memory (`sandbox.gpu_budget`): what a job reserves (torch.compile's
first call of the baseline included), what its candidate may take, what the grader gives
back after it, and what is the host's fault when memory runs out: the grader's own
out-of-memory error, or a candidate's that this process confirms (`gpu_full_verdict`). A
job that met a full GPU runs once more, alone (`should_retry_alone`).
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from sandbox import device_share
from sandbox.gpu_budget import GIB, estimate_gib
from sandbox.gpu_gate import GpuGate, SharedHold
from sandbox.grading.stages import add_stage, stage
from sandbox.result import VerifyResult
from sandbox.timing import L2_FLUSH_BYTES

if TYPE_CHECKING:
    from sandbox.process import CandidateProcess

# A timed loop waits this long at most for calls past their lease to end: they still run
# on the GPU (`GpuGate.exclusive`). In an 8-worker run of GiB programs, where slow
# candidates overran their leases, the timed loops of memory-bound kernels spread by
# 5-18% (about 1% alone): the GPU work a timed loop did not yet keep out.
OVERRUN_WAIT_S = 20.0
# GPU memory a grader may keep between jobs (its clock's buffers, library workspaces).
RETAINED_GPU_BYTES = GIB
# Up to this much the allocator's cache stays after a job (the clock's 256 MiB flush buffer
# included): the next job's small tensors reuse its blocks, where giving them back and
# allocating again would wait on the driver, busy creating candidates' CUDA contexts.
KEPT_CACHE_BYTES = 512 * 2**20
MEMORY_QUERY_S = 2.0  # how long a finished job waits for its candidate's memory figures
# torch.compile's first call of a baseline: this many times the problem's I/O, plus a
# fixed allowance (`baseline_compile_bytes`). Measured on an H100 (torch 2.11, one compile
# thread), the device's peak above the inputs during that call was 0.35x the I/O for a
# pointwise chain, 0.5x for softmax and layer_norm, 1.0x for a matmul with GELU and 1.67x
# for conv2d (cuDNN's workspace), 50 MiB for a 4 KiB problem; the allocator kept up to 2x
# the I/O cached after it (`release_gpu_memory` hands that back).
BASELINE_COMPILE_IO_FACTOR = 3.0
BASELINE_COMPILE_FIXED_BYTES = GIB


class CandidateOutOfMemory(torch.cuda.OutOfMemoryError):
    """The candidate's harness says an allocation failed for want of GPU memory (`gpu_full`),
    with PyTorch's message (`reported`): a claim, until `gpu_full_verdict` confirms it."""

    def __init__(self, reported: str) -> None:
        super().__init__(f"the candidate ran out of GPU memory: {reported[:300]}")
        self.reported = reported


@contextlib.contextmanager
def shared_hold(gate: GpuGate | None, result: VerifyResult) -> Iterator[SharedHold | None]:
    """A share of the GPU for correctness work (`sandbox.gpu_gate`); None without one."""
    if gate is None:
        yield None
        return
    with gate.shared() as hold:
        add_stage(result, "gpu_wait", hold.waited_s)
        yield hold


@contextlib.contextmanager
def exclusive_hold(gate: GpuGate | None, result: VerifyResult) -> Iterator[None]:
    """The GPU alone, host-wide, for a timed loop: concurrent work distorts timings."""
    if gate is None:
        raise RuntimeError("timing needs a GPU")
    with gate.exclusive(quiet_within=OVERRUN_WAIT_S) as hold:
        add_stage(result, "timing_wait", hold.waited_s)
        add_stage(result, "timing_overrun_wait", hold.overrun_wait_s)
        if not hold.quiet:
            print(
                f"sandbox: timing beside a call still running past its GPU lease "
                f"after {hold.overrun_wait_s:.1f} s",
                file=sys.stderr,
            )
        with stage(result, "timing"):
            yield


def candidate_gpu_bytes(io_bytes: int, timing_bytes: int = 0) -> int:
    """A candidate's GPU memory cap: 3x the problem's I/O (at least 2 GiB), plus the
    timing clock's L2 flush buffer, which lives in the candidate's allocator too, plus
    `timing_bytes` for its timed loops' extra input sets and kept outputs
    (`ProblemEntry.timing_bytes`).

    A timed candidate holds its inputs and up to three sets of outputs; the rest is
    room for the intermediate tensors of a multi-kernel translation. (Without the flush
    buffer's share, a conv_transpose3d + group_norm translation, its intermediate as
    large as its 642 MiB output, ran out of its cap in a timed loop.)
    """
    return max(2 * GIB, 3 * io_bytes) + L2_FLUSH_BYTES + timing_bytes


def baseline_compile_bytes(io_bytes: int) -> int:
    """GPU memory of torch.compile's first call of the problem's reference, besides the
    grader's copies: the compiled graph's inputs, outputs and intermediate buffers, and
    Inductor's autotuning (each configuration of a kernel run on real buffers, an L2 flush
    buffer per benchmark), library workspaces and the compile's own CUDA work."""
    return int(BASELINE_COMPILE_IO_FACTOR * io_bytes) + BASELINE_COMPILE_FIXED_BYTES


def job_gpu_gib(
    io_bytes: int, compiles_baseline: bool = False, timing_bytes: tuple[int, int] = (0, 0)
) -> int:
    """GiB a job reserves: the grader's copies (inputs, reference, the candidate's
    outputs read back: about twice the I/O) plus all its candidate may take, or, in a job
    that compiles the baseline first (`compiles_baseline`), what that stage takes if more.

    The baselines are measured before the job's candidate takes any memory (its process
    holds only a CUDA context then), and the compile's leftovers are handed back after
    them (`release_gpu_memory`): the two stages share one reservation, which must hold
    the larger. Unreserved, Inductor's memory once filled an 8-worker H200 and others'
    jobs ran out of memory (`sandbox_error`).
    """
    # What bounds the grader's own peak (`gpu_memory_gib["grader_peak"]`, allocator and
    # shared buffers at one moment): during a candidate call, its private inputs, their
    # copy in the exchange, the reference and the output buffers: 2x the I/O; comparisons
    # and the mutation check add at most `compare.CHUNK_ELEMENTS` x 28 bytes (224 MiB).
    # In the one job per grader and problem that measures the rounding allowance, the
    # float64 reference alone: twice the float32 reference's own peak (inputs, outputs and
    # intermediates), with the reference and the outputs parked in host memory and the
    # inputs widened in place (`judgment.allow_for_rounding`). Size this from GPU runs.
    # Timing's extra input sets and kept outputs (`timing_bytes`: the candidate's, the
    # grader's own) count in both stages: baselines are timed on input sets too.
    candidate_extra, grader_extra = timing_bytes
    need = 2 * io_bytes + grader_extra + candidate_gpu_bytes(io_bytes, candidate_extra)
    if compiles_baseline:
        need = max(need, 2 * io_bytes + grader_extra + baseline_compile_bytes(io_bytes))
    return estimate_gib(need, factor=1.0)


def gpu_budget_gib(workers: int) -> int:
    """GiB the graders may reserve: 90% of the GPU less every process's CUDA context."""
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    contexts = 3 * workers  # a grader, its candidate and the next one: about 1 GiB each
    return max(1, int(0.9 * total) - contexts)


def note_gpu_memory(proc: CandidateProcess, result: VerifyResult) -> None:
    """The job's GPU memory peaks: the grader's (its allocator and the buffers it
    shared, at one moment) and, from a candidate still answering, the candidate's
    allocator's. `grader_peak_sum` is the figure earlier runs reported as the grader's
    peak: the allocator's peak plus the buffers' peak, often from different moments."""
    together, allocated = device_share.held_bytes_peak()
    result.gpu_memory_gib["grader_peak"] = together / GIB
    result.gpu_memory_gib["grader_peak_sum"] = (allocated + device_share.created_bytes_peak()) / GIB
    if result.verdict == "timeout" or proc.proc.poll() is not None:
        return
    with contextlib.suppress(Exception):  # statistics only: never the verdict
        reply = proc.request(time.monotonic() + MEMORY_QUERY_S, cmd="memory")
        peak = float(reply["peak_bytes"]) if reply.get("ok") else math.nan
        if math.isfinite(peak) and peak >= 0:
            result.gpu_memory_gib["candidate_peak"] = peak / GIB


def release_gpu_memory() -> None:
    """Hand the job's GPU memory back before its reservation ends.

    What a grader keeps between jobs is outside every reservation and can starve the
    other graders: collect cycles that still hold tensors, then say what remains. A
    cache of at most `KEPT_CACHE_BYTES` stays for the next job.
    """
    if torch.cuda.memory_reserved() <= KEPT_CACHE_BYTES:
        return
    torch.cuda.empty_cache()
    if torch.cuda.memory_reserved() <= RETAINED_GPU_BYTES:
        return
    gc.collect()
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    if reserved > RETAINED_GPU_BYTES:
        print(
            f"drtriton grader {os.getpid()}: {reserved / GIB:.2f} GiB of GPU memory "
            f"still held after a job ({torch.cuda.memory_allocated() / GIB:.2f} GiB "
            f"in live tensors{_largest_live()})",
            file=sys.stderr,
            flush=True,
        )


def _largest_live(count: int = 3) -> str:
    """The largest CUDA tensors still reachable, for the report of memory held after a
    job: `; largest: [shape] dtype, ...` (empty when none is found)."""
    found = []
    with warnings.catch_warnings():  # (some of torch's module objects warn when looked at)
        warnings.simplefilter("ignore")
        for value in gc.get_objects():
            with contextlib.suppress(Exception):
                if isinstance(value, torch.Tensor) and value.is_cuda:
                    found.append((value.untyped_storage().nbytes(), value))
    found.sort(key=lambda pair: -pair[0])
    shown = [f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}" for _, t in found[:count]]
    return f"; largest: {', '.join(shown)}" if shown else ""


_SIZE_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_ASKED = re.compile(r"Tried to allocate ([0-9]+(?:\.[0-9]+)?) (B|KiB|MiB|GiB|TiB)\b")


def requested_bytes(message: str) -> int | None:
    """The size of the allocation a PyTorch out-of-memory message says failed; None if it
    names none."""
    asked = _ASKED.search(message)
    return None if asked is None else int(float(asked[1]) * _SIZE_UNITS[asked[2]])


def free_gpu_bytes() -> int | None:
    """The GPU's free memory as the driver reports it to this process; None without a GPU."""
    if not torch.cuda.is_available():
        return None
    try:
        return int(torch.cuda.mem_get_info()[0])
    except RuntimeError:
        return None


def gpu_full_verdict(reported: str, cap_bytes: int, free_bytes: int | None) -> tuple[str, str]:
    """The verdict on a candidate that says its allocation failed because others filled
    the GPU (`gpu_full`), decided from what this process knows, not from the claim.

    Only where the allocation fitted the candidate's cap and the GPU's free memory,
    measured here (`free_gpu_bytes`) while the candidate still holds what it held, is
    short of it is the host at fault (`sandbox_error`, which clients retry; the grader
    runs the job once more, alone). Past its cap, or with room on the GPU, the candidate
    ran out of its own memory (`resource_limit`); a claim without a size, or on a grader
    with no GPU, is one the harness never makes (`tampering`).
    """
    asked = requested_bytes(reported)
    first_line = (reported.strip().splitlines() or [""])[0][:300]
    if free_bytes is None:
        return "tampering", "the candidate's process claimed a full GPU on a grader with none"
    if asked is None:
        return (
            "tampering",
            f"the candidate's process claimed a full GPU, naming no size: {first_line}",
        )
    if asked > cap_bytes:
        return "resource_limit", (
            f"the candidate asked for {asked / GIB:.2f} GiB of GPU memory at once, more than "
            f"its cap of {cap_bytes / GIB:.2f} GiB: {first_line}"
        )
    if free_bytes >= asked:
        return "resource_limit", (
            f"the candidate ran out of its GPU memory cap of {cap_bytes / GIB:.2f} GiB "
            f"(the GPU had {free_bytes / GIB:.2f} GiB free for its {asked / GIB:.2f} GiB "
            f"request): {first_line}"
        )
    return "sandbox_error", (
        f"the GPU had {free_bytes / GIB:.2f} GiB free for the candidate's "
        f"{asked / GIB:.2f} GiB request, within its cap: other jobs filled it: {first_line}"
    )


def should_retry_alone(error: BaseException | None, has_budget: bool) -> bool:
    """Whether a job's first try, ended in `error`, runs once more with the whole budget.

    An out-of-memory error that reaches the job is the host's (the grader's own stages, or
    a candidate's shortage confirmed by `gpu_full_verdict`): other jobs' memory, or memory
    no reservation counts, filled the GPU. A job that fits the GPU alone then waits for all
    of it rather than fail, where a budget can give it the GPU alone.
    """
    return isinstance(error, torch.cuda.OutOfMemoryError) and has_budget
