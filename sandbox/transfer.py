"""How tensors cross between the grader and a candidate process, for one command.

The grader owns the memory; the candidate maps it. On a GPU that can share memory between
processes (`sandbox.device_share`) a tensor is device memory both map: the grader copies its
inputs in on the device, the candidate computes on them where they are and copies its outputs into
the grader's output buffers, and nothing crosses the bus. Elsewhere (CPU mode, or a driver
without the virtual memory API) a tensor is a file in the job directory (tmpfs): the
candidate's harness maps it by name; the grader, for whom that directory is hostile, writes
and reads it only through the descriptor it made it with (`sandbox.safe_fs`). Each file is
allocated whole when it is made, after the job directory's cap grew by its size
(`sandbox.jail.quota`): a candidate that filled its directory cannot make the grader's
writes, or the harness's through its mapping, fail halfway.

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
import stat
from typing import Any

import torch

from sandbox import device_share, safe_fs
from sandbox.jail import quota

SHARE_MIN_BYTES = 64 << 20
# Files are written and read through the grader's own descriptors in pieces this large: a
# GPU tensor crosses to the host one piece at a time.
FILE_CHUNK_BYTES = 64 << 20


class ExchangeTampered(Exception):
    """A file the grader made for a command no longer holds what it should (the candidate
    cut or grew it): the candidate's doing, never the grader's."""


class JobDirectoryFull(ExchangeTampered):
    """The grader's file did not fit in room made for it just before: the candidate wrote
    into its job directory while the grader was making a command's files (only a thread or
    a process of its own, left running between commands, can)."""


def numel_of(spec: dict[str, Any]) -> int:
    numel = 1
    for dim in spec["shape"]:
        numel *= dim
    return numel


class Exchange:
    """The tensors of one candidate command, in memory this process owns.

    Files are created under names no one could have made ahead of time, in the job
    directory opened once by descriptor (`sandbox.safe_fs`), and read and written only
    through the descriptors made then: a name the candidate later replaces (a symlink to a
    host file, a FIFO) is never opened by the grader. `close` (or leaving a `with` block)
    closes them and removes their names.
    """

    def __init__(
        self, job_dir: str, device: str, shared: bool, share_min_bytes: int = SHARE_MIN_BYTES
    ) -> None:
        self.job_dir = job_dir
        self.device = device
        self.shared = shared
        self.share_min_bytes = share_min_bytes
        self._buffers: list[device_share.SharedBuffer | None] = []
        self._dir_fd: int | None = None
        self._files: dict[str, tuple[int, int]] = {}  # path -> (descriptor, bytes)
        self._room: dict[str, quota.Room] = {}  # path -> what the job's cap grew by for it

    def __enter__(self) -> Exchange:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
                    spec["path"] = self._file(f"{name}{i}-", value, writable)
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

    def _new_file(self, prefix: str, nbytes: int) -> tuple[str, int]:
        """A fresh file of `nbytes` zero bytes, all allocated, its path and this side's
        descriptor: on top of the candidate's allowance where the job directory has a cap."""
        if self._dir_fd is None:
            self._dir_fd = safe_fs.open_dir(self.job_dir)
        name = safe_fs.unique_name(prefix, ".bin")
        path = os.path.join(self.job_dir, name)
        room = quota.grow(self.job_dir, nbytes)
        try:
            fd = safe_fs.create_file(self._dir_fd, name)
        except OSError as err:
            quota.give_back(self.job_dir, room)
            _raise_if_full(err, room)
            raise
        self._files[path] = (fd, nbytes)  # from here on `release` removes it, room and all
        self._room[path] = room
        try:
            quota.allocate(fd, nbytes)
        except OSError as err:
            _raise_if_full(err, room)
            raise
        return path, fd

    def _file(self, prefix: str, value: torch.Tensor, writable: bool) -> str:
        flat = value.detach().reshape(-1)
        path, fd = self._new_file(prefix, flat.numel() * flat.element_size())
        if not writable:
            _write_tensor(fd, flat)
        elif value.is_floating_point():  # a reply forged without writing reads as NaN
            piece = torch.full((min(flat.numel(), _chunk(flat)),), float("nan"), dtype=flat.dtype)
            _write_repeated(fd, _bytes_of(piece), flat.numel() * flat.element_size())
        # (Other blank outputs read as the zeros the file was made of.)
        safe_fs.hand_over(fd)
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
            path, fd = self._new_file(f"{name}{i}-", self._files[spec["path"]][1])
            safe_fs.hand_over(fd)
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
        until its next command). A file is copied at once, through this side's
        descriptor: later writes to it, or a name replaced, cannot change what is judged.
        A file cut or grown since it was made is `ExchangeTampered`.
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
        fd, nbytes = self._files[spec["path"]]
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != nbytes:
            raise ExchangeTampered(
                f"changed the size of a file the grader made ({info.st_size} bytes, not {nbytes})"
            )
        copy = torch.empty(numel, dtype=dtype, device=self.device)
        step = _chunk(copy)
        for start in range(0, numel, step):
            part = copy[start : start + step]
            host = part if self.device == "cpu" else torch.empty_like(part, device="cpu")
            wanted = host.numel() * host.element_size()
            got = safe_fs.read_into(fd, _bytes_of(host), start * copy.element_size())
            if got != wanted:
                raise ExchangeTampered("cut a file the grader made while it was read")
            if host is not part:
                part.copy_(host)
        return copy.view(spec["shape"])

    def release(self, specs: list[dict[str, Any]]) -> None:
        """Let go of these specs' memory early (GiB problems: memory is tight): shared
        buffers dropped, files closed, their names removed and their room given back."""
        freed = quota.NO_ROOM
        for spec in specs:
            if "fd_index" in spec:
                self._buffers[spec["fd_index"]] = None
            elif "path" in spec and spec["path"] in self._files:
                fd, _ = self._files.pop(spec["path"])
                os.close(fd)
                if self._dir_fd is not None:
                    safe_fs.unlink(self._dir_fd, os.path.basename(spec["path"]))
                room = self._room.pop(spec["path"], quota.NO_ROOM)
                freed = quota.Room(freed.bytes + room.bytes, freed.files + room.files)
        quota.give_back(self.job_dir, freed)

    def close(self) -> None:
        """Drop this side's hold on the buffers (views still in use keep theirs mapped),
        close the files and remove their names."""
        self._buffers.clear()
        self.release([{"path": path} for path in list(self._files)])
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None


def _raise_if_full(error: OSError, room: quota.Room) -> None:
    """A failure to make one of the grader's files for want of room is the candidate's doing
    where its directory's cap had just grown for the file (else the host's: `error` stands)."""
    if room != quota.NO_ROOM and quota.is_full(error):
        raise JobDirectoryFull(
            "filled its job directory while the grader was writing to it"
        ) from error


def _chunk(tensor: torch.Tensor) -> int:
    """Elements of `tensor` in one piece of a file's write or read (`FILE_CHUNK_BYTES`)."""
    return max(1, FILE_CHUNK_BYTES // tensor.element_size())


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous host tensor, writable, without a copy."""
    return memoryview(tensor.view(torch.uint8).numpy()).cast("B")


def _write_tensor(fd: int, flat: torch.Tensor) -> None:
    """`flat` (one dimension, any device) into the file from its start, a piece at a time."""
    step = _chunk(flat)
    for start in range(0, flat.numel(), step):
        host = flat[start : start + step].contiguous().cpu()
        safe_fs.write_all(fd, _bytes_of(host), start * flat.element_size())


def _write_repeated(fd: int, piece: memoryview, nbytes: int) -> None:
    """`piece` written again and again into the file's first `nbytes`."""
    for offset in range(0, nbytes, len(piece)):
        safe_fs.write_all(fd, piece[: nbytes - offset], offset)


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
