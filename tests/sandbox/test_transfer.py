"""Tensors between the grader and a candidate: files on CPU, shared device memory on a GPU."""

from __future__ import annotations

import multiprocessing
import os
import socket
from pathlib import Path

import pytest
import torch

from sandbox.transfer import Exchange, receive_descriptors, send_descriptors

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def test_files_carry_inputs_and_blank_outputs(tmp_path: Path) -> None:
    exchange = Exchange(str(tmp_path), "cpu", shared=False)
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    specs = exchange.put("in", [x, 3, torch.empty(0)], writable=False)
    assert specs[1] == {"value": 3}
    assert "path" not in specs[2]  # nothing to carry for an empty tensor
    assert torch.equal(exchange.read(specs[0]), x)
    assert exchange.read(specs[2]).shape == (0,)
    out = exchange.put("out", [x], writable=True)
    assert torch.isnan(exchange.read(out[0])).all()  # a forged reply reads as NaN
    blanks = exchange.blanks(specs, "after")
    assert blanks[0]["path"] != specs[0]["path"]
    assert torch.equal(exchange.read(blanks[0]), torch.zeros_like(x))
    assert exchange.descriptors() == []


def test_small_tensors_take_files_even_where_memory_is_shared(tmp_path: Path) -> None:
    # Shared device memory costs a fixed driver round per tensor and command: below the
    # threshold a file is cheaper, so nothing here touches the GPU.
    exchange = Exchange(str(tmp_path), "cpu", shared=True, share_min_bytes=1 << 10)
    x = torch.arange(8, dtype=torch.float32)
    (spec,) = exchange.put("in", [x], writable=False)
    assert "path" in spec and "fd_index" not in spec
    assert torch.equal(exchange.read(spec), x)
    (blank,) = exchange.blanks([spec], "after")
    assert blank["path"] != spec["path"]  # the harness writes the inputs as left there
    assert exchange.descriptors() == []


@needs_gpu
def test_large_tensors_share_memory_and_stand_for_themselves_after_the_call(
    tmp_path: Path,
) -> None:
    exchange = Exchange(str(tmp_path), "cuda", shared=True, share_min_bytes=1 << 10)
    small, large = torch.ones(8, device="cuda"), torch.ones(1 << 10, device="cuda")
    specs = exchange.put("in", [small, large], writable=False)
    assert "path" in specs[0] and "fd_index" in specs[1]
    blanks = exchange.blanks(specs, "after")
    assert blanks[0]["path"] != specs[0]["path"] and blanks[1] == specs[1]
    for fd in exchange.descriptors():
        os.close(fd)


def test_a_read_is_a_private_copy_of_a_file(tmp_path: Path) -> None:
    exchange = Exchange(str(tmp_path), "cpu", shared=False)
    spec = exchange.put("out", [torch.ones(4)], writable=False)[0]
    judged = exchange.read(spec)
    mapped = torch.from_file(spec["path"], shared=True, size=4, dtype=torch.float32)
    mapped.fill_(5.0)  # a lingering candidate writing after its reply
    assert torch.equal(judged, torch.ones(4))


def test_descriptors_follow_a_message_on_the_socket(tmp_path: Path) -> None:
    left, right = socket.socketpair()
    paths = [tmp_path / f"f{i}" for i in range(3)]
    for i, path in enumerate(paths):
        path.write_text(str(i))
    fds = [os.open(path, os.O_RDONLY) for path in paths]
    try:
        left.sendall(b"command")
        send_descriptors(left.fileno(), fds)
        assert right.recv(7) == b"command"  # the message is not eaten by the descriptors
        received = receive_descriptors(right.fileno(), 3)
        assert [os.read(fd, 8) for fd in received] == [b"0", b"1", b"2"]
        for fd in received:
            os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)
        left.close()
        right.close()


def test_missing_descriptors_are_an_error() -> None:
    left, right = socket.socketpair()
    try:
        left.sendall(b"F")  # the byte, but no descriptors with it
        with pytest.raises(RuntimeError, match="expected 2 shared buffers, received 0"):
            receive_descriptors(right.fileno(), 2)
    finally:
        left.close()
        right.close()


def _write_through_shared_memory(sock: socket.socket, size: int) -> None:
    from sandbox.device_share import SharedBuffer

    torch.cuda.init()
    (fd,) = receive_descriptors(sock.fileno(), 1)
    view = SharedBuffer.open(fd, size).tensor(torch.float32, [1024])
    os.close(fd)
    view.mul_(2.0)
    torch.cuda.synchronize()


@needs_gpu
def test_another_process_writes_the_graders_device_memory() -> None:
    from sandbox.device_share import available

    assert available() is None
    exchange = Exchange("/nonexistent", "cuda", shared=True, share_min_bytes=0)
    x = torch.arange(1024, dtype=torch.float32, device="cuda")
    (spec,) = exchange.put("in", [x], writable=False)
    left, right = socket.socketpair()
    child = multiprocessing.get_context("spawn").Process(
        target=_write_through_shared_memory, args=(right, spec["size"])
    )
    child.start()
    send_descriptors(left.fileno(), exchange.descriptors())
    child.join(60)
    assert child.exitcode == 0
    assert torch.equal(exchange.read(spec), 2 * x)
