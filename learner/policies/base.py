"""What every policy offers search and evaluation: candidates for problems.

A policy turns problem sources (the functional format, DESIGN §2) into candidate Triton
sources. Our checkpoint, the teacher and a hosted model sit behind this one interface, so
`drtriton search` and `drtriton eval` treat them alike and the prompt is built in one
place (`synth.teacher.prompt.build_prompt`) for every policy that reads text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Proposal:
    """One answer of a policy to one problem.

    `code` is the candidate source to verify, or None when the answer holds none (nothing
    between the code markers, a truncated answer, a program outside the teacher's
    templates); `text` is the raw answer as the policy gave it, for logs; `error` says why
    there is no code when the policy knows.
    """

    code: str | None
    text: str = ""
    truncated: bool = False
    tokens: int = 0
    error: str | None = None


class PolicyError(RuntimeError):
    """The policy cannot answer at all (unreachable endpoint, missing checkpoint): a clear
    one-line message for the command line, never a per-problem failure."""


@runtime_checkable
class Policy(Protocol):
    """Candidates for problems; `samples` answers per problem, in problem order.

    Answers are reproducible for a given `seed` where the policy allows it (our checkpoint
    and the teacher do; a hosted model may not). A failure to answer one problem is a
    `Proposal` with `code=None` and an `error`, so one bad problem never loses the others.
    """

    name: str

    def propose(
        self, problems: Sequence[str], samples: int = 1, seed: int = 0
    ) -> list[list[Proposal]]: ...
