"""The teacher as a policy: `synth.teacher.translate` behind the `Policy` interface.

The teacher writes one translation per program, so its answers do not depend on the seed
and every sample of a problem is the same code; search and evaluation verify identical
code once. A program outside the teacher's templates is a `Proposal` without code whose
`error` says why, never an exception that loses the other problems.
"""

from __future__ import annotations

from collections.abc import Sequence

from learner.policies.base import Proposal


class TeacherPolicy:
    """Deterministic translations of functional-format problems (DESIGN §3, the teacher)."""

    name = "teacher"

    def propose(
        self, problems: Sequence[str], samples: int = 1, seed: int = 0
    ) -> list[list[Proposal]]:
        if samples < 1:
            raise ValueError(f"samples must be at least 1, got {samples}")
        return [[answer(problem)] * samples for problem in problems]


def answer(problem: str) -> Proposal:
    """The teacher's translation of one problem, or why there is none."""
    from synth.teacher import TranslationError, translate
    from synth.teacher.prompt import build_completion

    try:
        code = translate(problem).code
    except TranslationError as err:
        return Proposal(code=None, error=f"not translatable: {' '.join(str(err).split())}")
    except Exception as err:  # noqa: BLE001 - a template's bug must not lose the other problems
        return Proposal(code=None, error=f"the teacher failed: {type(err).__name__}: {err}")
    return Proposal(code=code, text=build_completion(code))
