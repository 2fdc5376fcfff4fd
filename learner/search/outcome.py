"""What a search reports: the answer, how it was verified, and the table behind it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# How the answer was verified.
WHOLE = "whole"  # every step converted: the module itself judged against the problem
SEGMENTS = "segments"  # a hybrid: each run of converted steps judged on the program's values
UNVERIFIED = "none"  # no answer


@dataclass
class FragmentResult:
    """One fragment's row: what the policy proposed and what the sandbox said."""

    start: int
    stop: int
    lines: list[str]
    samples: int = 0  # answers asked of the policy
    judged: int = 0  # distinct codes the sandbox judged
    correct: int = 0
    verdict: str = "no_code"  # "correct" if any was, else the most frequent verdict
    kernel_ms: float | None = None  # the best correct kernel's time
    eager_ms: float | None = None
    compile_ms: float | None = None
    error: str = ""  # why there was no code, or why the span cannot be a fragment
    chosen: str = ""  # "triton" or "pytorch" when in the answer's composition
    dropped: bool = False  # its kernel failed inside a larger verified run
    code: str | None = field(default=None, repr=False)  # the best correct kernel

    @property
    def span(self) -> tuple[int, int]:
        return (self.start, self.stop)

    @property
    def converted(self) -> bool:
        return self.code is not None and not self.dropped


@dataclass
class Check:
    """One verification of an assembled run of converted steps [start, stop)."""

    start: int
    stop: int
    verdict: str
    message: str = ""
    candidate_ms: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    round: int = 0


@dataclass
class SearchOutcome:
    """The search's answer for one problem.

    `candidate` is the verified module (None when there is none); `verdict` the verdict of
    the whole: the sandbox's on the module when every step is converted, "correct" for a
    hybrid whose every converted run passed, otherwise the failure that ended the search.
    Speedups are measured on a GPU sandbox (None without timing); a hybrid's eager speedup
    adds its runs' and its PyTorch spans' times, and it has no torch.compile figure.
    """

    candidate: str | None
    verdict: str
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    verification: str = UNVERIFIED
    composition: list[dict[str, Any]] = field(default_factory=list)
    fragments: list[FragmentResult] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    converted_ops: int = 0
    total_ops: int = 0
    timed: bool = False
    message: str = ""

    @property
    def correct(self) -> bool:
        return self.verdict == "correct" and self.candidate is not None

    @property
    def hybrid(self) -> bool:
        """Whether the answer keeps PyTorch spans (not sendable whole to the sandbox)."""
        return any(not part["converted"] for part in self.composition)

    def to_json_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for row in data["fragments"]:
            row.pop("code", None)
        data["hybrid"] = self.hybrid
        return data
