"""Helpers shared by the teacher's tests."""

from __future__ import annotations

from collections.abc import Iterable

from synth.teacher import Translation, translate
from synth.teacher.check import check_candidate

from .conftest import DEVICE


def assert_correct(source: str, seeds: Iterable[int] = (0, 1)) -> Translation:
    """Translate `source` and check the candidate against PyTorch; return the translation."""
    translation = translate(source)
    result = check_candidate(source, translation.code, seeds=tuple(seeds), device=DEVICE)
    assert result.correct, (
        f"{result.message}\n--- problem\n{source}\n--- candidate\n{translation.code}"
    )
    return translation


def generated_programs(
    level: int,
    count: int,
    seed: int,
    ops: list[str] | None = None,
    max_flops: int = 2**15,
    pool: int = 8,
) -> list[str] | None:
    """Up to `count` tiny-profile programs from the synth generator with at most `max_flops`
    (cheap under the interpreter), or None when the generator is not importable."""
    try:
        from synth.generate import generate_programs
    except ImportError:
        return None
    cheap = [
        record.source
        for record in generate_programs(level, pool, seed, "tiny", ops)
        if record.flops <= max_flops
    ]
    return cheap[:count]
