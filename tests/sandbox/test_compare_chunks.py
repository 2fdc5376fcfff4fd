"""The comparison works chunk by chunk on the device and reads its figures back once.

Its verdicts, messages and error figures are those of the plain one-pass comparison (kept
here as the specification); its temporaries are bounded by the chunk, not the output; and
however many chunks, it waits for the device once (on a GPU, a read is a synchronisation).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from sandbox import compare
from sandbox.compare import Comparison, compare_tensor, differs, nonfinite
from tests.sandbox.live_bytes import LiveBytes, peak_extra

INF, NAN = float("inf"), float("nan")


def one_pass(expected: torch.Tensor, got: torch.Tensor, atol: float, rtol: float) -> Comparison:
    """The comparison over the whole tensor at once (what the grader did before chunks)."""
    if got.shape != expected.shape:
        return Comparison(False, message=f"shape {list(got.shape)} != {list(expected.shape)}")
    if got.dtype != expected.dtype:
        return Comparison(False, message=f"dtype {got.dtype} != {expected.dtype}")
    if expected.numel() == 0:
        return Comparison(True)
    exp = expected.reshape(-1).to(torch.float64)
    out = got.reshape(-1).to(torch.float64)
    finite = torch.isfinite(exp)
    infinite = torch.isinf(exp)
    nonfinite_ok = bool(torch.equal(torch.isnan(exp), torch.isnan(out))) and bool(
        torch.equal(exp[infinite], out[infinite])
    )
    bad = finite & ~torch.isfinite(out)
    diff = torch.where(finite & ~bad, (exp - out).abs(), 0.0)
    tolerance = torch.where(finite, atol + rtol * exp.abs(), 1e300)
    mismatched = int(((diff > tolerance) | bad).sum())
    bad_finite = int(bad.sum())
    max_abs = float(diff.max())
    max_rel = float((diff / exp.abs().clamp_min(1e-12))[finite].max()) if finite.any() else 0.0
    fraction = mismatched / expected.numel()
    passed = mismatched == 0 and nonfinite_ok
    message = ""
    if bad_finite:
        message = f"{bad_finite} NaN/Inf values where the reference is finite"
    elif not nonfinite_ok:
        message = "NaN/Inf pattern differs from the reference"
    elif not passed:
        percent = f"{fraction:.2%}" if fraction >= 0.01 else f"{fraction * 100:.2g}%"
        message = (
            f"{mismatched:,} of {expected.numel():,} values ({percent}) outside "
            f"atol={atol:g} rtol={rtol:g} (max abs error {max_abs:.3g})"
        )
    out_of_tolerance = not passed and nonfinite_ok and not bad_finite
    return Comparison(passed, max_abs, max_rel, fraction, message, out_of_tolerance)


def tricky_cases() -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(120, 257, generator=g)
    noise = torch.randn(120, 257, generator=g)
    yield "identical", ref, ref.clone()
    yield "within tolerance", ref, ref + 5e-5 * noise
    one_off = ref.clone()
    one_off[77, 200] += 1e-3  # one value in 30,840 outside
    yield "a tiny fraction outside", ref, one_off
    large = ref * 1e6
    yield "rtol on large values, within", large, large * (1 + 5e-5)
    yield "rtol on large values, outside", large, large * (1 + 3e-4)
    special = ref.clone()
    special[3, :5] = torch.tensor([NAN, INF, -INF, NAN, INF])
    special[100, 256] = NAN
    yield "matching NaN and Inf", special, special.clone()
    for label, row, value in [
        ("NaN where the reference is finite", 50, NAN),
        ("Inf where the reference is finite", 50, -INF),
        ("finite where the reference is NaN", 3, 0.0),
    ]:
        got = special.clone()
        got[row, 0] = value
        yield label, special, got
    flipped = special.clone()
    flipped[3, 1] = -INF  # +Inf in the reference
    yield "an infinity of the wrong sign", special, flipped
    nan_for_inf = special.clone()
    nan_for_inf[3, 2] = NAN  # -Inf in the reference
    yield "NaN where the reference is Inf", special, nan_for_inf
    both = special.clone()
    both[3, 0], both[9, 9] = 1.0, both[9, 9] + 1.0
    yield "a pattern and a value wrong", special, both
    transposed = ref.t()  # a reference that is a view: not contiguous
    yield "non-contiguous reference", transposed, transposed.contiguous() + 2e-4 * noise.t()
    expanded = ref[:1].expand(120, 257)
    yield "expanded reference", expanded, expanded + 1e-3 * noise
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        yield f"{dtype}", ref.to(dtype), (ref + 3e-3 * noise).to(dtype)
    ints = torch.randint(-5, 5, (120, 257), generator=g)
    yield "integers", ints, torch.where(ints == 3, 4, ints)
    yield "booleans", ints > 0, ints >= 0
    yield "a scalar", torch.tensor(1.0), torch.tensor(1.001)
    yield "empty", torch.zeros(0, 5), torch.zeros(0, 5)
    yield "another shape", ref, ref[:, :-1]
    yield "another dtype", ref, ref.double()


CASES = list(tricky_cases())


@pytest.mark.parametrize("chunk", [100, 1000, 1 << 23])
@pytest.mark.parametrize(("label", "expected", "got"), CASES, ids=[c[0] for c in CASES])
def test_chunked_comparison_is_the_one_pass_comparison(
    monkeypatch: pytest.MonkeyPatch,
    chunk: int,
    label: str,
    expected: torch.Tensor,
    got: torch.Tensor,
) -> None:
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", chunk)
    for atol, rtol in ((1e-4, 1e-4), (1e-2, 0.0), (0.0, 1e-3)):
        assert compare_tensor(expected, got, atol, rtol) == one_pass(expected, got, atol, rtol)


def test_the_cases_cover_passing_and_every_kind_of_failure() -> None:
    messages = [one_pass(e, g, 1e-4, 1e-4).message for _, e, g in CASES]
    assert "" in messages
    for fragment in ("NaN/Inf values where", "pattern differs", "values (", "shape"):
        assert any(fragment in m for m in messages), fragment
    tiny = one_pass(CASES[2][1], CASES[2][2], 1e-4, 1e-4)
    assert not tiny.passed and tiny.mismatch_fraction == pytest.approx(1 / 30840)


@pytest.mark.parametrize("transpose", [False, True])
def test_comparison_temporaries_are_bounded_by_the_chunk(
    monkeypatch: pytest.MonkeyPatch, transpose: bool
) -> None:
    """28 bytes an element of one chunk at most, whatever the size of the output (a
    non-contiguous reference is copied a chunk at a time, never whole)."""
    chunk = 1 << 14
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", chunk)
    peaks = []
    for rows in (256, 1024):  # 1 and 4 MiB of float32
        expected = torch.randn(rows, 1024)
        got = expected + 1e-5
        if transpose:
            expected, got = expected.t(), got.t().contiguous()
        peak, comparison = peak_extra(compare_tensor, expected, got, 1e-4, 1e-4)
        assert comparison.passed
        peaks.append(peak)
    assert peaks[0] == peaks[1]  # the output's size does not matter
    assert peaks[1] <= 28 * chunk + 4096
    one_pass_peak, _ = peak_extra(one_pass, expected, got, 1e-4, 1e-4)
    assert one_pass_peak > 40 * expected.numel()  # ~ 70 bytes an element, for comparison


def test_comparison_reads_the_device_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU every read back is a synchronisation: one for all chunks and outputs."""
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", 1000)
    reads = []
    host_values = compare.host_values
    monkeypatch.setattr(
        compare, "host_values", lambda values: reads.append(len(values)) or host_values(values)
    )
    expected = [torch.randn(100, 100), torch.randn(37)]
    got = [e + 1e-5 for e in expected]
    with LiveBytes() as probe:
        pending = [compare.measure(e, g, 1e-4, 1e-4) for e, g in zip(expected, got, strict=True)]
        flag = differs(expected[0], got[0])
        comparisons, (changed,) = compare.conclude(pending, flag)
    assert probe.host_reads == 0  # no `.item()`, `bool()`, `torch.equal` on the way
    assert reads == [len(expected) + 1]
    assert all(c.passed for c in comparisons) and changed == 1.0


def test_differs_is_not_torch_equal() -> None:
    a = torch.randn(50, 60)
    b = a.clone()
    assert compare.host_values([differs(a, b)]) == [0.0]
    b[49, 59] = torch.nextafter(b[49, 59], torch.tensor(INF))  # one ulp, whatever a's size
    assert compare.host_values([differs(a, b)]) == [1.0]
    a[0, 0] = NAN  # NaN differs from NaN, as torch.equal has it
    assert compare.host_values([differs(a, a.clone())]) == [1.0]
    assert compare.host_values([differs(a, a.t())]) == [1.0]  # another shape


def test_nonfinite_counts_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", 64)
    values = torch.randn(300, 70).t()
    values[1, 2], values[69, 299], values[5, 5] = NAN, INF, -INF
    assert compare.host_values(
        [nonfinite(values), nonfinite(torch.ones(3, dtype=torch.int64))]
    ) == [
        3.0,
        0.0,
    ]


def test_rounding_noise_samples_a_view_without_copying_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compare, "NOISE_SAMPLE", 4096)
    exact = torch.randn(1024, 1024, dtype=torch.float64)
    approx = exact.float()
    peak, noise = peak_extra(compare.rounding_noise, approx.t(), exact.t())
    assert noise > 0
    assert peak < 0.05 * exact.numel() * 8  # the sample's, not a flat copy of the output
