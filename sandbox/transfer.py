"""How tensors cross between the grader and a candidate process, for one command.

The grader owns the memory; the candidate maps it. On a GPU that can share memory between
processes (`sandbox.device_share`) a tensor is device memory both map: the grader copies its
inputs in on the device, the candidate computes on them where they are and copies its outputs into
the grader's output buffers, and nothing crosses the bus. Elsewhere (CPU mode, or a driver
without the virtual memory API) a tensor is a file in the job directory (tmpfs), mapped by
both sides.

A spec (JSON, sent with the command) names each tensor: `{"shape", "dtype"}` plus either
`"path"` (a file) or `"fd_index"` (the position of its descriptor among those that follow
the command on the socket), or `{"value": ...}` for a non-tensor argument.

Shared device memory pays a fixed cost per tensor and command (the driver creates, maps,
exports, imports and unmaps it, and synchronises both sides), which only large tensors
repay: below `SHARE_MIN_BYTES` a tensor goes through a file even where memory can be shared.
On an H200 at 4 workers, a correctness trial of a small problem cost 21 ms when tensors
went through files and 79 ms once they went through shared memory (other changes came in
between; the split is to be measured); a GiB tensor costs seconds through a file.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from sandbox import device_share
from sandbox.isolation import hand_over

SHARE_MIN_BYTES = 64 << 20


def numel_of(spec: dict[str, Any]) -> int:
    numel = 1
    for dim in spec["shape"]:
        numel *= dim
    return numel


class Exchange:
    """The tensors of one candidate command, in memory this process owns."""

    def __init__(
        self, job_dir: str, device: str, shared: bool, share_min_bytes: int = SHARE_MIN_BYTES
    ) -> None:
        self.job_dir = job_dir
        self.device = device
        self.shared = shared
        self.share_min_bytes = share_min_bytes
        self._buffers: list[device_share.SharedBuffer | None] = []

    def put(self, name: str, values: list[Any], writable: bool) -> list[dict[str, Any]]:
        """Specs for `values`: copies of them, or (`writable`) blank space their size."""
        specs: list[dict[str, Any]] = []
        for i, value in enumerate(values):
            if not isinstance(value, torch.Tensor):
                specs.append({"value": value})
                continue
            spec = {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
            if value.numel():
                if self.shared and value.numel() * value.element_size() >= self.share_min_bytes:
                    spec.update(self._share(value, writable))
                else:
                    spec["path"] = self._file(f"{name}{i}.bin", value, writable)
            specs.append(spec)
        return specs

    def _share(self, value: torch.Tensor, writable: bool) -> dict[str, Any]:
        buffer = self._new_buffer(value.numel() * value.element_size(), value.device.index or 0)
        view = buffer.tensor(value.dtype, value.shape)
        if writable:  # a reply forged without writing reads as NaN (or zeros)
            view.fill_(float("nan") if value.is_floating_point() else 0)
        else:
            view.copy_(value.detach())
        self._buffers.append(buffer)
        return {"fd_index": len(self._buffers) - 1, "size": buffer.size}

    @staticmethod
    def _new_buffer(nbytes: int, ordinal: int) -> device_share.SharedBuffer:
        """Shared memory, after handing back what PyTorch's cache holds if the GPU is full.

        Still full: PyTorch's own out-of-memory error, which the grader reports as the
        host's shortage (workers share the GPU), not the candidate's fault.
        """
        for attempt in range(2):
            try:
                return device_share.SharedBuffer.create(nbytes, ordinal)
            except device_share.DeviceShareError as err:
                if "OUT_OF_MEMORY" not in str(err):
                    raise
                if attempt:
                    raise torch.OutOfMemoryError(
                        f"CUDA out of memory. Tried to allocate {nbytes / 2**30:.2f} GiB "
                        "of shared device memory"
                    ) from err
                torch.cuda.empty_cache()
        raise AssertionError("unreachable")

    def _file(self, filename: str, value: torch.Tensor, writable: bool) -> str:
        path = os.path.join(self.job_dir, filename)
        buffer = torch.from_file(path, shared=True, size=value.numel(), dtype=value.dtype)
        if writable:
            buffer.fill_(float("nan") if value.is_floating_point() else 0)
        else:
            buffer.copy_(value.detach().reshape(-1))  # from the device, one pass
        del buffer
        hand_over(path)
        os.chmod(path, 0o600)
        return path

    def blanks(self, specs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
        """Zero-filled files the size of `specs`' files (sparse: nothing is written).

        The harness writes the inputs as the candidate left them there. Shared device
        memory needs none: the candidate computes on the grader's copy itself, so its spec
        stands for itself (as does any spec without a file).
        """
        blanks = []
        for i, spec in enumerate(specs):
            if "path" not in spec:
                blanks.append(spec)
                continue
            path = os.path.join(self.job_dir, f"{name}{i}.bin")
            with open(path, "wb") as handle:
                handle.truncate(os.path.getsize(spec["path"]))
            hand_over(path)
            os.chmod(path, 0o600)
            blanks.append({**spec, "path": path})
        return blanks

    def descriptors(self) -> list[int]:
        """Fresh descriptors of the shared buffers, in `fd_index` order (the caller closes them)."""
        fds: list[int] = []
        if any(buffer is not None for buffer in self._buffers):
            # The copies in and the blank fills run on this process's stream; the other
            # process knows nothing of it and must find them done.
            torch.cuda.synchronize()
        try:
            for buffer in self._buffers:
                if buffer is None:
                    raise RuntimeError("a released buffer cannot be sent")
                fds.append(buffer.export())
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def read(self, spec: dict[str, Any]) -> torch.Tensor:
        """The tensor as judged, on this process's device.

        Shared memory is judged in place (the candidate has replied; it runs nothing
        until its next command). A file is copied at once, in one pass from its
        mapping: later writes to the file cannot change what is judged.
        """
        dtype = getattr(torch, spec["dtype"])
        numel = numel_of(spec)
        if numel == 0:
            return torch.empty(spec["shape"], dtype=dtype, device=self.device)
        if "fd_index" in spec:
            buffer = self._buffers[spec["fd_index"]]
            if buffer is None:
                raise RuntimeError("this shared buffer was released")
            return buffer.tensor(dtype, spec["shape"])
        mapped = torch.from_file(spec["path"], shared=False, size=numel, dtype=dtype)
        copy = mapped.to(self.device) if self.device != "cpu" else mapped.clone()
        return copy.view(spec["shape"])

    def release(self, specs: list[dict[str, Any]]) -> None:
        """Let go of these specs' shared buffers early (GiB problems: memory is tight)."""
        for spec in specs:
            if "fd_index" in spec:
                self._buffers[spec["fd_index"]] = None

    def close(self) -> None:
        """Drop this side's hold on the buffers (views still in use keep theirs mapped)."""
        self._buffers.clear()


def send_descriptors(conn_fd: int, fds: list[int]) -> None:
    """Pass `fds` over the unix socket `conn_fd` (after the command they belong to)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=os.dup(conn_fd)) as sock:
        socket.send_fds(sock, [b"F"], fds)


def receive_descriptors(conn_fd: int, count: int) -> list[int]:
    """The `count` descriptors that follow a command on the unix socket `conn_fd`."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=os.dup(conn_fd)) as sock:
        _, fds, _, _ = socket.recv_fds(sock, 1, count)
    if len(fds) != count:
        for fd in fds:
            os.close(fd)
        raise RuntimeError(f"expected {count} shared buffers, received {len(fds)}")
    return list(fds)
