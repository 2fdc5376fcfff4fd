"""The stream hold that keeps host launch time out of a timed run (sandbox/stream_hold.py).

On CPU: the sequence protocol with a stand-in launcher, and the blocking kernel's PTX
assembled by the `ptxas` that Triton ships, for each GPU generation. On a GPU: work
queued behind a hold waits for the release, and a hold no one releases lets itself go.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from sandbox.stream_hold import HOLD_TIMEOUT_NS, StreamHold, hold_ptx


class _Launches:
    """The driver's kernel launch stood in for: records each sequence, returns `code`."""

    def __init__(self, code: int = 0) -> None:
        self.code = code
        self.sequences: list[int] = []

    def __call__(self, sequence: int) -> int:
        self.sequences.append(sequence)
        return self.code


def test_each_hold_waits_for_the_next_sequence_number_and_release_writes_it() -> None:
    word = ctypes.c_uint32(0)
    launches = _Launches()
    hold = StreamHold(launches, ctypes.addressof(word))
    for expected in (1, 2, 3):
        hold.hold()
        assert launches.sequences[-1] == expected
        assert word.value == expected - 1  # the kernel still spins: its number not yet written
        hold.release()
        assert word.value == expected


def test_a_hold_the_driver_refused_holds_nothing() -> None:
    word = ctypes.c_uint32(0)
    hold = StreamHold(_Launches(code=1), ctypes.addressof(word))
    hold.hold()
    assert word.value == 1  # released at once: the run is covered by the spin alone


def _ptxas(name: str) -> Path | None:
    try:
        import triton.backends.nvidia as nvidia
    except ImportError:
        return None
    path = Path(os.path.dirname(nvidia.__file__)) / "bin" / name
    return path if path.exists() else None


@pytest.mark.parametrize(
    ("major", "minor", "assembler"),
    [(7, 0, "ptxas"), (8, 0, "ptxas"), (9, 0, "ptxas"), (10, 0, "ptxas-blackwell")],
)
def test_the_blocking_kernel_assembles_for_each_gpu_generation(
    tmp_path: Path, major: int, minor: int, assembler: str
) -> None:
    ptxas = _ptxas(assembler)
    if ptxas is None:
        pytest.skip(f"Triton's {assembler} is not installed")
    source = tmp_path / "hold.ptx"
    source.write_text(hold_ptx(major, minor))
    done = subprocess.run(
        [str(ptxas), f"-arch=sm_{major}{minor}", str(source), "-o", str(tmp_path / "hold.cubin")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "hold.cubin").stat().st_size > 0


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@needs_gpu
def test_a_held_stream_runs_nothing_until_released() -> None:
    from sandbox.stream_hold import stream_hold

    hold = stream_hold()
    assert hold is not None, "this GPU's driver makes no stream hold: timing falls back"
    x = torch.ones(1 << 20, device="cuda")
    x * 2  # loaded first: a kernel's lazy loading waits for the whole context, hold and all
    done = torch.cuda.Event()
    hold.hold()
    y = x * 2
    done.record()
    time.sleep(0.005)
    assert not done.query()  # queued behind the hold
    hold.release()
    done.synchronize()
    assert torch.equal(y, x * 2)


@needs_gpu
def test_a_hold_no_one_releases_lets_itself_go() -> None:
    """A call that waits for the GPU inside a timed run would otherwise wait forever."""
    from sandbox.stream_hold import stream_hold

    hold = stream_hold()
    assert hold is not None
    hold.hold()
    began = time.monotonic()
    torch.cuda.synchronize()
    waited = time.monotonic() - began
    assert HOLD_TIMEOUT_NS * 0.9e-9 <= waited < HOLD_TIMEOUT_NS * 1e-9 + 1.0
    hold.release()
