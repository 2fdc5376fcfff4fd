"""GPU memory that the grader and a candidate process both map, handed over as a file descriptor.

Why: the grader and the candidate live in different processes (and pid namespaces), and
moving GiB tensors through files costs seconds per trial. Legacy `cudaIpc` handles do not
cross pid namespaces; memory made with CUDA's virtual memory API and exported as a POSIX
file descriptor does, passed over the unix socket that already joins the two processes
(SCM_RIGHTS). Both sides then see the same device memory and nothing crosses the bus.

Only the CUDA driver (`libcuda.so.1`, through ctypes) is needed. A buffer lives as long as
the tensors viewing it: the view holds the buffer, which unmaps itself when the last view
is gone (after the device has finished with it).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import threading
from typing import Any

import torch

_ALLOCATION_PINNED = 1
_HANDLE_POSIX_FD = 1
_LOCATION_DEVICE = 1
_ACCESS_READWRITE = 3
_GRANULARITY_RECOMMENDED = 1

# Bound now, before any candidate code can replace them (the harness imports this first).
_as_tensor = torch.as_tensor


class DeviceShareError(RuntimeError):
    """A CUDA driver call for shared device memory failed."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocationProp(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class _Driver:
    """The few driver entry points this module needs, each result checked."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        u64, size = ctypes.c_ulonglong, ctypes.c_size_t
        signatures: dict[str, list[Any]] = {
            "cuInit": [ctypes.c_uint],
            "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
            "cuDevicePrimaryCtxRetain": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int],
            "cuCtxGetCurrent": [ctypes.POINTER(ctypes.c_void_p)],
            "cuCtxSetCurrent": [ctypes.c_void_p],
            "cuCtxSynchronize": [],
            "cuMemGetAllocationGranularity": [
                ctypes.POINTER(size),
                ctypes.POINTER(_AllocationProp),
                ctypes.c_int,
            ],
            "cuMemCreate": [ctypes.POINTER(u64), size, ctypes.POINTER(_AllocationProp), u64],
            "cuMemExportToShareableHandle": [ctypes.c_void_p, u64, ctypes.c_int, u64],
            "cuMemImportFromShareableHandle": [ctypes.POINTER(u64), ctypes.c_void_p, ctypes.c_int],
            "cuMemAddressReserve": [ctypes.POINTER(u64), size, size, u64, u64],
            "cuMemMap": [u64, size, size, u64, u64],
            "cuMemSetAccess": [u64, size, ctypes.POINTER(_AccessDesc), size],
            "cuMemUnmap": [u64, size],
            "cuMemAddressFree": [u64, size],
            "cuMemRelease": [u64],
            "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        }
        for name, argtypes in signatures.items():
            function = getattr(self.lib, name)
            function.argtypes = argtypes
            function.restype = ctypes.c_int
        self.check("cuInit", 0)

    def check(self, name: str, *args: Any) -> None:
        code = getattr(self.lib, name)(*args)
        if code != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorName(code, ctypes.byref(text))
            label = text.value.decode() if text.value else str(code)
            raise DeviceShareError(f"{name} failed: {label}")

    def bind_context(self, ordinal: int) -> None:
        """Make the device's primary context (the one PyTorch uses) current on this thread."""
        current = ctypes.c_void_p()
        self.check("cuCtxGetCurrent", ctypes.byref(current))
        if current.value:
            return
        device = ctypes.c_int()
        self.check("cuDeviceGet", ctypes.byref(device), ordinal)
        context = ctypes.c_void_p()
        self.check("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
        self.check("cuCtxSetCurrent", context)


_lock = threading.Lock()


@functools.cache
def cuda_driver() -> _Driver:
    try:
        return _Driver()
    except OSError as err:
        raise DeviceShareError(f"the CUDA driver library is not available: {err}") from None


def _prop(ordinal: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type = _ALLOCATION_PINNED
    prop.requestedHandleTypes = _HANDLE_POSIX_FD
    prop.location = _Location(_LOCATION_DEVICE, ordinal)
    return prop


class _Span:
    """What `torch.as_tensor` reads: a byte range of a buffer; keeps the buffer alive."""

    def __init__(self, buffer: SharedBuffer, nbytes: int) -> None:
        self.buffer = buffer
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (buffer.pointer, False),
            "version": 3,
            "strides": None,
        }


class _Usage:
    """Bytes of the buffers this process created and holds, and their peak: what PyTorch's
    allocator statistics cannot see (the grader's share of a job's GPU memory).

    With `with_allocator` (`track_with_allocator`), also the most that PyTorch's allocator
    and these buffers held at one moment: the buffers' bytes change only here, so before
    each change the allocator's peak since the previous one is added to the bytes the
    buffers held meanwhile, and the allocator's peak restarts.
    """

    live = 0
    peak = 0
    with_allocator = False
    together = 0  # the most of allocator + buffers at one moment
    allocated = 0  # the allocator's own peak (its statistics restart at every change)

    @classmethod
    def add(cls, nbytes: int) -> None:
        with _lock:
            if cls.with_allocator:
                cls._fold()
            cls.live += nbytes
            cls.peak = max(cls.peak, cls.live)

    @classmethod
    def _fold(cls) -> None:
        """Take the allocator's peak so far into `together` and `allocated`; restart it."""
        allocator_peak = torch.cuda.max_memory_allocated()
        cls.together = max(cls.together, allocator_peak + cls.live)
        cls.allocated = max(cls.allocated, allocator_peak)
        torch.cuda.reset_peak_memory_stats()


def created_bytes_peak(reset: bool = False) -> int:
    """The most bytes of created buffers held at once (since the last reset)."""
    with _lock:
        peak = _Usage.peak
        if reset:
            _Usage.peak = _Usage.live
    return peak


def track_with_allocator() -> None:
    """Follow PyTorch's allocator together with the created buffers (`held_bytes_peak`);
    from then on nothing else may rely on the allocator's peak statistics."""
    with _lock:
        _Usage.with_allocator = True
        _Usage._fold()


def held_bytes_peak(reset: bool = False) -> tuple[int, int]:
    """Since the last reset: the most bytes PyTorch's allocator and the created buffers
    held at one moment, and the most the allocator held (`track_with_allocator` first)."""
    with _lock:
        _Usage._fold()
        peaks = _Usage.together, _Usage.allocated
        if reset:
            _Usage.together = _Usage.allocated = 0
            _Usage._fold()
    return peaks


class SharedBuffer:
    """Device memory mapped into this process, exportable to another one as a descriptor."""

    def __init__(self, handle: int, size: int, ordinal: int) -> None:
        self.handle = handle
        self.size = size  # mapped bytes (a multiple of the allocation granularity)
        self.ordinal = ordinal
        self.pointer = 0
        self.created = False  # made here (counted in `_Usage`), not opened from another
        driver = cuda_driver()
        address = ctypes.c_ulonglong()
        try:
            driver.check("cuMemAddressReserve", ctypes.byref(address), size, 0, 0, 0)
            self.pointer = address.value
            driver.check("cuMemMap", self.pointer, size, 0, handle, 0)
            access = _AccessDesc(_Location(_LOCATION_DEVICE, ordinal), _ACCESS_READWRITE)
            driver.check("cuMemSetAccess", self.pointer, size, ctypes.byref(access), 1)
        except DeviceShareError:
            self.close(synchronize=False)
            raise

    @classmethod
    def create(cls, nbytes: int, ordinal: int = 0) -> SharedBuffer:
        """Fresh device memory for at least `nbytes` bytes."""
        driver = cuda_driver()
        with _lock:
            driver.bind_context(ordinal)
        prop = _prop(ordinal)
        granularity = ctypes.c_size_t()
        driver.check(
            "cuMemGetAllocationGranularity",
            ctypes.byref(granularity),
            ctypes.byref(prop),
            _GRANULARITY_RECOMMENDED,
        )
        step = max(1, granularity.value)
        size = max(step, -(-nbytes // step) * step)
        handle = ctypes.c_ulonglong()
        driver.check("cuMemCreate", ctypes.byref(handle), size, ctypes.byref(prop), 0)
        buffer = cls(handle.value, size, ordinal)
        buffer.created = True
        _Usage.add(size)
        return buffer

    @classmethod
    def open(cls, fd: int, size: int, ordinal: int = 0) -> SharedBuffer:
        """Map the memory another process exported as `fd` (the caller still owns `fd`)."""
        driver = cuda_driver()
        with _lock:
            driver.bind_context(ordinal)
        handle = ctypes.c_ulonglong()
        driver.check(
            "cuMemImportFromShareableHandle",
            ctypes.byref(handle),
            ctypes.c_void_p(fd),
            _HANDLE_POSIX_FD,
        )
        return cls(handle.value, size, ordinal)

    def export(self) -> int:
        """A new file descriptor for this memory; the caller sends it on and closes it."""
        fd = ctypes.c_int(-1)
        cuda_driver().check(
            "cuMemExportToShareableHandle", ctypes.byref(fd), self.handle, _HANDLE_POSIX_FD, 0
        )
        return fd.value

    def tensor(self, dtype: torch.dtype, shape: list[int] | tuple[int, ...]) -> torch.Tensor:
        """A tensor viewing the start of this memory (it keeps the buffer mapped)."""
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if not 0 < nbytes <= self.size:
            raise ValueError(f"{nbytes} bytes do not fit a shared buffer of {self.size}")
        raw = _as_tensor(_Span(self, nbytes), device=f"cuda:{self.ordinal}")
        return raw.view(dtype).view(list(shape))

    def close(self, synchronize: bool = True) -> None:
        """Unmap and release (idempotent). Waits for the device: kernels may still read it."""
        driver = cuda_driver()
        with _lock:
            driver.bind_context(self.ordinal)
        if synchronize:
            driver.lib.cuCtxSynchronize()
        if self.pointer:
            driver.lib.cuMemUnmap(self.pointer, self.size)
            driver.lib.cuMemAddressFree(self.pointer, self.size)
            self.pointer = 0
        if self.handle:
            driver.lib.cuMemRelease(self.handle)
            self.handle = 0
            if self.created:
                _Usage.add(-self.size)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the driver may be gone
            self.close()


@functools.cache
def available(ordinal: int = 0) -> str | None:
    """None when this host can share device memory between processes; else why not."""
    try:
        buffer = SharedBuffer.create(1, ordinal)
        os.close(buffer.export())
        view = buffer.tensor(torch.uint8, [1])
        view.fill_(7)
        if int(view.item()) != 7:
            return "shared device memory did not read back what was written"
        del view
        buffer.close()
    except (DeviceShareError, RuntimeError, ValueError) as err:
        return str(err)
    return None
