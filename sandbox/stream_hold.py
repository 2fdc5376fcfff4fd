"""Hold a CUDA stream until the host has queued a whole timed call.

A timed run records its start event, calls the kernel, and records its end event. Had the
GPU reached the start event before the host finished launching the call, every
microsecond the host spent launching (Python, argument checks, allocation) and every
time the host process was descheduled on a busy machine would be timed as the kernel's.
A fixed spin before the start event covers a launch of known length only: a 2 ms
streaming kernel launched by a candidate process on a loaded 16-core host read 10-15%
slower than its own time, with 5-18% spread between its runs.

So each run begins with a one-thread kernel that spins until a word of pinned host
memory reaches the run's sequence number, which the host writes only once the end event
is queued (a "blocking kernel", as in NVIDIA's nvbench). The kernel is a few lines of
PTX loaded through the driver (`libcuda.so.1` by ctypes: no compiler, no Triton build in
each candidate), and it lets itself go after `HOLD_TIMEOUT_NS` by the GPU's own clock, so
a call that waits for the GPU inside a timed run costs that run the timeout, never a
hang. The driver's stream memory operations (`cuStreamWaitValue32`) would need no
kernel, but Linux drivers leave them off by default (`NVreg_EnableStreamMemOPs`): on an
H200 with driver 580 the wait never returned. Where no hold can be made, `stream_hold`
returns None and timing falls back to the spin alone.

A kernel launched for the first time behind a hold makes the driver load it, and lazy
loading waits for the whole context, the spinning hold included (until its timeout):
`timing.time_cuda` calls the candidate in warm-up runs before any run is held.
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Callable
from typing import Any

from sandbox.device_share import DeviceShareError, cuda_driver

HOLD_TIMEOUT_NS = 50_000_000  # a hold no one releases lets go after 50 ms
_HOST_ALLOC_FLAGS = 0x1 | 0x2  # CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP
_KERNEL = "drtriton_hold"
_CC_MAJOR, _CC_MINOR = 75, 76  # CUdevice_attribute: compute capability


def hold_ptx(major: int, minor: int) -> str:
    """The blocking kernel for a GPU of compute capability `major.minor` (7.0 or later)."""
    version = "8.7" if major >= 10 else "7.8"  # the oldest PTX that knows the target
    return f"""
.version {version}
.target sm_{major}{minor}
.address_size 64

.visible .entry {_KERNEL}(.param .u64 word, .param .u32 sequence, .param .u64 timeout_ns)
{{
    .reg .pred %released, %in_time;
    .reg .b32 %seen, %wanted;
    .reg .b64 %address, %began, %now, %waited, %limit;

    ld.param.u64 %address, [word];
    ld.param.u32 %wanted, [sequence];
    ld.param.u64 %limit, [timeout_ns];
    mov.u64 %began, %globaltimer;
SPIN:
    ld.volatile.u32 %seen, [%address];
    setp.ge.u32 %released, %seen, %wanted;
    @%released bra DONE;
    mov.u64 %now, %globaltimer;
    sub.u64 %waited, %now, %began;
    setp.lt.u64 %in_time, %waited, %limit;
    @%in_time bra SPIN;
DONE:
    ret;
}}
"""


class StreamHold:
    """`hold()` queues the blocking kernel on the current stream; `release()` lets it go."""

    def __init__(self, launch: Callable[[int], int], word: int) -> None:
        """`launch(sequence)`: queue a hold until the word reaches `sequence`, returning the
        driver's status; `word`: the host address of the pinned 32-bit word it watches."""
        self._launch = launch
        self._word = ctypes.c_uint32.from_address(word)
        self._sequence = 0

    def hold(self) -> None:
        self._sequence = (self._sequence + 1) % 2**32 or 1
        if self._launch(self._sequence) != 0:
            self.release()  # nothing held: this run is covered by the spin alone

    def release(self) -> None:
        self._word.value = self._sequence


def stream_hold() -> StreamHold | None:
    """A hold on PyTorch's current CUDA stream, or None where the driver cannot make one.

    Tried once before it is trusted: work queued behind a hold must wait for the release.
    """
    import torch

    try:
        torch.cuda.init()
        driver = cuda_driver()
        ordinal = torch.cuda.current_device()
        driver.bind_context(ordinal)  # PyTorch's primary context, on this thread
        hold = StreamHold(*_load(driver, ordinal, lambda: torch.cuda.current_stream().cuda_stream))
        behind = torch.cuda.Event()
        hold.hold()
        behind.record()
        time.sleep(0.002)
        waited = not behind.query()
        hold.release()
        torch.cuda.synchronize()
        if not waited:
            _why_not("work queued behind the hold ran before the release")
            return None
        return hold
    except (OSError, AttributeError, RuntimeError, DeviceShareError) as error:
        _why_not(f"{type(error).__name__}: {error}")
        return None


def _load(driver: Any, ordinal: int, stream: Callable[[], int]) -> tuple[Callable[[int], int], int]:
    """Load the kernel and allocate its word: (launch, host address of the word)."""
    lib = driver.lib
    pointer, c_int, c_uint = ctypes.POINTER, ctypes.c_int, ctypes.c_uint
    for name, argtypes in {
        "cuDeviceGetAttribute": [pointer(c_int), c_int, c_int],
        "cuModuleLoadData": [pointer(ctypes.c_void_p), ctypes.c_char_p],
        "cuModuleGetFunction": [pointer(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p],
        "cuMemHostAlloc": [pointer(ctypes.c_void_p), ctypes.c_size_t, c_uint],
        "cuMemHostGetDevicePointer_v2": [pointer(ctypes.c_uint64), ctypes.c_void_p, c_uint],
        "cuLaunchKernel": [ctypes.c_void_p] + [c_uint] * 7 + [ctypes.c_void_p] * 3,
    }.items():
        getattr(lib, name).argtypes = argtypes
        getattr(lib, name).restype = c_int

    device, major, minor = c_int(), c_int(), c_int()
    driver.check("cuDeviceGet", ctypes.byref(device), ordinal)
    driver.check("cuDeviceGetAttribute", ctypes.byref(major), _CC_MAJOR, device)
    driver.check("cuDeviceGetAttribute", ctypes.byref(minor), _CC_MINOR, device)
    if major.value < 7:
        raise RuntimeError(f"compute capability {major.value}.{minor.value} is older than 7.0")
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    ptx = hold_ptx(major.value, minor.value).encode()
    driver.check("cuModuleLoadData", ctypes.byref(module), ptx)
    driver.check("cuModuleGetFunction", ctypes.byref(function), module, _KERNEL.encode())

    word = ctypes.c_void_p()  # pinned, mapped into the device's address space; never freed
    driver.check("cuMemHostAlloc", ctypes.byref(word), 4, _HOST_ALLOC_FLAGS)
    ctypes.c_uint32.from_address(word.value).value = 0
    device_word = ctypes.c_uint64()
    driver.check("cuMemHostGetDevicePointer_v2", ctypes.byref(device_word), word, 0)

    sequence, timeout = ctypes.c_uint32(), ctypes.c_uint64(HOLD_TIMEOUT_NS)
    params = (ctypes.c_void_p * 3)(
        ctypes.addressof(device_word), ctypes.addressof(sequence), ctypes.addressof(timeout)
    )
    launch_kernel = lib.cuLaunchKernel

    def launch(wanted: int) -> int:
        sequence.value = wanted  # the driver copies the arguments at launch
        return launch_kernel(function, 1, 1, 1, 1, 1, 1, 0, stream(), params, None)

    launch.keep = (module, word, device_word, sequence, timeout, params)  # type: ignore[attr-defined]
    return launch, word.value


def _why_not(reason: str) -> None:
    """Say once, on stderr, why timing falls back to the spin alone."""
    print(f"drtriton sandbox: no stream hold ({reason}); timed runs use the spin", file=sys.stderr)
