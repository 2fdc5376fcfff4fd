"""A counting allocator hook for the tests: tensor memory allocated, alive, and its peak.

`LiveBytes` is a dispatch mode: every ATen op run under it is seen, and every tensor it
returns on fresh storage is counted until the last tensor on that storage is gone. Views
and in-place results share their input's storage and count nothing new; memory of
tensors made before the mode is not counted (nor its release). On the CPU this measures
what the grader's code allocates on its device, the way PyTorch's allocator statistics do
on a GPU.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# Ops whose results are read back on the host: on a GPU, each one waits for the device.
HOST_READS = frozenset(
    {"aten._local_scalar_dense.default", "aten.equal.default", "aten.is_nonzero.default"}
)


class LiveBytes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.host_reads = 0
        self._storages: dict[int, list[int]] = {}  # data pointer -> [tensors alive, bytes]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if str(func) in HOST_READS:
            self.host_reads += 1
        kwargs = kwargs or {}
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        out = func(*args, **kwargs)
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._track(tensor, inputs)
        return out

    def _track(self, tensor: torch.Tensor, inputs: set[int]) -> None:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        entry = self._storages.get(key)
        if entry is None:
            if key == 0 or key in inputs:  # empty, or a view of memory made before the mode
                return
            entry = self._storages[key] = [0, storage.nbytes()]
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        weakref.finalize(tensor, self._release, key)

    def _release(self, key: int) -> None:
        entry = self._storages[key]
        entry[0] -= 1
        if entry[0] == 0:
            del self._storages[key]
            self.live -= entry[1]

    def restart_peak(self) -> int:
        """Start a new peak from what is alive now (returned)."""
        self.peak = self.live
        return self.live


def peak_extra(function: Any, *args: Any) -> tuple[int, Any]:
    """The most bytes the tensors `function(*args)` made held at once, and its result."""
    with LiveBytes() as probe:
        result = function(*args)
    return probe.peak, result
