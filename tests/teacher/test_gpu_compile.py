"""Every template compiles for an NVIDIA GPU (sm_90), checked ahead of time on CPU.

Triton's interpreter runs kernels without compiling them, so it misses what only the
GPU compiler rejects: a loop-carried variable changing type, an invalid `tl.dot`
shape, a compiler pass that does not handle a pattern. This compiles the kernels
each candidate launches, with the launch's own constexprs, without needing a GPU
(in a separate process: this one runs Triton in interpreter mode).
"""

from __future__ import annotations

import re

import pytest

from synth.teacher import translate
from synth.teacher.check import compile_for_gpu_isolated, ptx_for_gpu_isolated

from .programs import LEVEL1, random_program, render
from .test_fusion import FUSED

pytest.importorskip("triton.backends.nvidia.compiler")


def _assert_compile(sources: dict[str, str]) -> None:
    pairs = [(source, translate(source).code) for source in sources.values()]
    errors = compile_for_gpu_isolated(pairs)
    failed = {name: errs for name, errs in zip(sources, errors, strict=True) if errs}
    assert not failed, "\n\n".join(f"{name}:\n" + "\n".join(errs) for name, errs in failed.items())


def test_every_operator_and_fusion_rule_compiles() -> None:
    sources = {f"{kind}[0]": programs[0] for kind, programs in LEVEL1.items()}
    # A convolution's last case has channels enough for tl.dot's tiles; the first sums its
    # products itself.
    sources |= {f"{kind}[-1]": LEVEL1[kind][-1] for kind in ("conv1d", "conv_transpose2d")}
    sources |= {name: render(inputs, calls) for name, (inputs, calls, _) in FUSED.items()}
    _assert_compile(sources)


@pytest.mark.slow
def test_all_handwritten_and_random_programs_compile() -> None:
    sources = {
        f"{kind}[{i}]": source
        for kind, programs in LEVEL1.items()
        for i, source in enumerate(programs)
    }
    sources |= {f"random-{seed}": random_program(5 if seed % 2 else 10, seed) for seed in range(30)}
    _assert_compile(sources)


def _vector_accesses(ptx: str) -> tuple[int, int]:
    """(128-bit global loads, 128-bit global stores) in one kernel's PTX."""
    return len(re.findall(r"ld\.global[.\w]*\.v4", ptx)), len(
        re.findall(r"st\.global[.\w]*\.v4", ptx)
    )


def test_flat_pointwise_kernels_move_128_bits_at_a_time_on_odd_sizes() -> None:
    # 21,021 elements: no multiple of 16. Bounded by it, the mask is not provably constant
    # over 4 lanes and every access is scalar (half the bandwidth on an H200), so the full
    # blocks go first, bounded by a multiple of the block, and the ragged end after.
    source = render([[7, 1001, 3]], ["torch.sigmoid({0})"])
    full_blocks, ragged_end = ptx_for_gpu_isolated(source, translate(source).code)
    loads, stores = _vector_accesses(full_blocks)
    assert loads > 0 and stores > 0
    assert _vector_accesses(ragged_end) == (0, 0)  # the premise: an odd bound is scalar


@pytest.mark.parametrize(("length", "width"), [(1020, 4), (1022, 2)])
def test_norm_rows_load_as_wide_as_their_length_allows(length: int, width: int) -> None:
    # A row of 1020 floats is 16-byte aligned wherever it starts, 1022 only 8-byte: the
    # kernel makes that visible to the compiler (VEC), which else sees an odd length.
    source = render([[64, length]], [f"F.layer_norm({{0}}, normalized_shape=[{length}])"])
    (ptx,) = ptx_for_gpu_isolated(source, translate(source).code)
    assert re.search(rf"ld\.global[.\w]*\.v{width}", ptx)
