"""Hold a CUDA stream until the host has queued a whole timed call.

A timed run records its start event, calls the kernel, and records its end event. Had the
GPU reached the start event before the host finished launching the call, every
microsecond the host spent launching (Python, argument checks, allocation) and every
time the host process was descheduled on a busy machine would be timed as the kernel's.
A fixed spin before the start event covers a launch of known length only: a 2 ms
streaming kernel launched by a candidate process on a loaded 16-core host read 10-15%
slower than its own time, with 5-18% spread between its runs.

So the stream waits, on the GPU, for a word of pinned host memory to reach a sequence
number (the driver's stream memory operation `cuStreamWaitValue32`), and the host
writes that number only once the end event is queued. Should the call itself wait for
the GPU (a synchronisation inside it), the stream would never get there: a watchdog
thread writes the number after `HOLD_TIMEOUT_S`, and the run is timed as before.
Only the CUDA driver (`libcuda.so.1`, through ctypes) is needed; where the driver or
the device lacks stream memory operations, `stream_hold` returns None and timing falls
back to the spin alone.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

from sandbox.device_share import DeviceShareError, cuda_driver

HOLD_TIMEOUT_S = 0.05  # the watchdog lets a held stream go after this long
_WAIT_GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ: wait until the word >= the value
_HOST_ALLOC_FLAGS = 0x1 | 0x2  # CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP


class StreamHold:
    """`hold()` queues a wait on the current stream; `release()` lets it go."""

    def __init__(self, wait: Any, stream: Any, word: int, device_word: int) -> None:
        """`wait`: the driver's cuStreamWaitValue32; `stream`: () -> the current stream's
        handle; `word`: the host address of a pinned 32-bit word, `device_word` the
        device's address of it."""
        self._wait = wait
        self._stream = stream
        self._host = ctypes.c_uint32.from_address(word)
        self._device = device_word
        self._sequence = 0
        self._deadline: float | None = None
        self._changed = threading.Condition()
        threading.Thread(target=self._watch, name="stream-hold-watchdog", daemon=True).start()

    def hold(self) -> None:
        with self._changed:
            self._sequence = (self._sequence + 1) % 2**32
            self._deadline = time.monotonic() + HOLD_TIMEOUT_S
            self._changed.notify()
        stream = ctypes.c_void_p(self._stream())
        if self._wait(stream, self._device, self._sequence, _WAIT_GEQ) != 0:
            self.release()  # nothing held: this run is covered by the spin alone

    def release(self) -> None:
        with self._changed:
            self._host.value = self._sequence
            self._deadline = None

    def _watch(self) -> None:
        with self._changed:
            while True:
                if self._deadline is None:
                    self._changed.wait()
                elif (left := self._deadline - time.monotonic()) > 0:
                    self._changed.wait(left)
                else:
                    self._host.value = self._sequence
                    self._deadline = None


def stream_hold() -> StreamHold | None:
    """A hold on the current CUDA stream, or None where the driver cannot make one.

    Tried once before it is trusted: work queued behind a hold must wait for the release.
    """
    import torch

    try:
        torch.cuda.init()
        driver = cuda_driver()
        driver.bind_context(torch.cuda.current_device())  # PyTorch's, on this thread
        lib = driver.lib
        wait = getattr(lib, "cuStreamWaitValue32_v2", None) or lib.cuStreamWaitValue32
        wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        wait.restype = ctypes.c_int
        for name, argtypes in (
            ("cuMemHostAlloc", [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]),
            (
                "cuMemHostGetDevicePointer_v2",
                [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint],
            ),
        ):
            getattr(lib, name).argtypes = argtypes
            getattr(lib, name).restype = ctypes.c_int
        word = ctypes.c_void_p()  # pinned, mapped into the device's address space; never freed
        driver.check("cuMemHostAlloc", ctypes.byref(word), 4, _HOST_ALLOC_FLAGS)
        ctypes.c_uint32.from_address(word.value).value = 0
        device_word = ctypes.c_uint64()
        driver.check("cuMemHostGetDevicePointer_v2", ctypes.byref(device_word), word, 0)
        hold = StreamHold(
            wait, lambda: torch.cuda.current_stream().cuda_stream, word.value, device_word.value
        )
        behind = torch.cuda.Event()
        hold.hold()
        behind.record()
        time.sleep(0.002)
        waited = not behind.query()
        hold.release()
        torch.cuda.synchronize()
        return hold if waited else None
    except (OSError, AttributeError, RuntimeError, DeviceShareError):
        return None
