"""The outcome of one verification, as plain Python and as the wire message."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from protos.drtriton.sandbox.v1 import sandbox_pb2 as pb

VERDICTS: tuple[str, ...] = tuple(
    v.name.lower() for v in pb.Verdict.DESCRIPTOR.values if v.name != "VERDICT_UNSPECIFIED"
)
# Verdicts that say nothing about the kernel: a learner masks them instead of scoring 0.
INFRASTRUCTURE_VERDICTS = frozenset({"sandbox_error", "bad_problem"})
# Characters a terminal acts on rather than shows: C0 controls but newline and tab (escape
# sequences, carriage returns that overwrite a line), DEL, C1 controls, and the invisible
# or direction-changing format characters (a line that reads other than it is).
_UNPRINTABLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u206f\ufeff]"
)


def printable(text: str) -> str:
    """`text` safe to print on a terminal: what it would act on is shown as an escape
    (ESC as `\\x1b`), newlines and tabs kept. For text a candidate wrote (its log, its
    error messages)."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def verdict_name(value: object) -> str:
    """The verdict's lower-case name, as data files carry it. Files written before names
    carry the enum's number (`7`, or `"7"`): it is read through the proto's enum. Other
    names (a file's own verdicts, such as the teacher's `untranslatable`) pass unchanged.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"a verdict is a name or an enum number, not {value!r:.60}")
    if isinstance(value, str) and not value.strip().isdigit():
        return value.lower()
    number = int(value)
    if number not in pb.Verdict.values() or number == pb.VERDICT_UNSPECIFIED:
        raise ValueError(f"{value!r} is no verdict number of the sandbox protocol")
    return pb.Verdict.Name(number).lower()


@dataclass
class TrialOutcome:
    index: int
    passed: bool
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    mismatch_fraction: float = 0.0
    message: str = ""


@dataclass
class VerifyResult:
    """What a client learns about one candidate (`verdict` is the lower-case enum name)."""

    verdict: str
    message: str = ""
    request_id: str = ""
    trials: list[TrialOutcome] = field(default_factory=list)
    candidate_ms: float | None = None
    candidate_spread: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    timing_runs: int = 0
    retimed: bool = False
    timing_unavailable_reason: str = ""
    kernel_launches: int = 0
    problem_degenerate: bool = False
    provenance: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    candidate_log: str = ""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    gpu_memory_gib: dict[str, float] = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        return self.verdict == "correct"

    @property
    def infrastructure_failure(self) -> bool:
        return self.verdict in INFRASTRUCTURE_VERDICTS

    def apply_baselines(
        self, eager_ms: float | None, compile_ms: float | None, sanity_bound: float
    ) -> None:
        """Set the baseline times and, for a timed candidate, the speedups over them.

        A speedup above `sanity_bound` is flagged `retimed`: the time that counts is
        already the larger of the event and host-clock measurements.
        """
        self.eager_ms, self.compile_ms = eager_ms, compile_ms
        if not self.candidate_ms or self.candidate_ms <= 0:
            return
        self.speedup_vs_eager = eager_ms / self.candidate_ms if eager_ms else None
        self.speedup_vs_compile = compile_ms / self.candidate_ms if compile_ms else None
        if self.speedup_vs_eager and self.speedup_vs_eager > sanity_bound:
            self.retimed = True

    def for_terminal(self) -> VerifyResult:
        """A copy whose text the candidate may have written (message, log, trial messages)
        is `printable`."""
        return replace(
            self,
            message=printable(self.message),
            candidate_log=printable(self.candidate_log),
            trials=[replace(t, message=printable(t.message)) for t in self.trials],
        )

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_proto(self) -> pb.VerifyResponse:
        timing = pb.Timing(
            runs=self.timing_runs,
            retimed=self.retimed,
            unavailable_reason=self.timing_unavailable_reason,
        )
        for name in (
            "candidate_ms",
            "candidate_spread",
            "eager_ms",
            "compile_ms",
            "speedup_vs_eager",
            "speedup_vs_compile",
        ):
            value = getattr(self, name)
            if value is not None:
                setattr(timing, name, float(value))
        trials = [
            pb.TrialResult(**{k: _text(v) for k, v in asdict(t).items()}) for t in self.trials
        ]
        return pb.VerifyResponse(
            request_id=self.request_id,
            verdict=pb.Verdict.Value(self.verdict.upper()),
            message=_text(self.message),
            trials=trials,
            timing=timing,
            kernel_launches=self.kernel_launches,
            problem_degenerate=self.problem_degenerate,
            provenance=pb.Provenance(**self.provenance),
            elapsed_s=self.elapsed_s,
            candidate_log=_text(self.candidate_log),
            stage_seconds=self.stage_seconds,
            gpu_memory_gib=self.gpu_memory_gib,
        )

    @classmethod
    def from_proto(cls, response: pb.VerifyResponse) -> VerifyResult:
        timing = response.timing

        def optional(name: str) -> float | None:
            return getattr(timing, name) if timing.HasField(name) else None

        provenance = {
            f.name: getattr(response.provenance, f.name) for f in pb.Provenance.DESCRIPTOR.fields
        }
        return cls(
            verdict=pb.Verdict.Name(response.verdict).lower(),
            message=response.message,
            request_id=response.request_id,
            trials=[
                TrialOutcome(
                    index=t.index,
                    passed=t.passed,
                    max_abs_error=t.max_abs_error,
                    max_rel_error=t.max_rel_error,
                    mismatch_fraction=t.mismatch_fraction,
                    message=t.message,
                )
                for t in response.trials
            ],
            candidate_ms=optional("candidate_ms"),
            candidate_spread=optional("candidate_spread"),
            eager_ms=optional("eager_ms"),
            compile_ms=optional("compile_ms"),
            speedup_vs_eager=optional("speedup_vs_eager"),
            speedup_vs_compile=optional("speedup_vs_compile"),
            timing_runs=timing.runs,
            retimed=timing.retimed,
            timing_unavailable_reason=timing.unavailable_reason,
            kernel_launches=response.kernel_launches,
            problem_degenerate=response.problem_degenerate,
            provenance=provenance,
            elapsed_s=response.elapsed_s,
            candidate_log=response.candidate_log,
            stage_seconds=dict(response.stage_seconds),
            gpu_memory_gib=dict(response.gpu_memory_gib),
        )


def _text(value: Any) -> Any:
    """Strings as UTF-8 can carry them (a lone surrogate from a candidate's message would
    fail the whole answer); other values as they are."""
    if not isinstance(value, str):
        return value
    return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
