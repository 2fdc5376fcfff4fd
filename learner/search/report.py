"""A search outcome as text: one summary line, the composition, the fragment table."""

from __future__ import annotations

from learner.search.outcome import SearchOutcome


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _speedup(value: float | None, against: str) -> str:
    return f", {value:.2f}x vs {against}" if value is not None else ""


def summary(outcome: SearchOutcome) -> str:
    """One line: the verdict, how it was verified, how much is Triton, the speedups."""
    line = f"{outcome.verdict}"
    if outcome.candidate is not None:
        line += (
            f" (verified {'as one candidate' if outcome.verification == 'whole' else 'by runs'})"
        )
    line += f", {outcome.converted_ops}/{outcome.total_ops} operators in Triton"
    line += _speedup(outcome.speedup_vs_eager, "eager")
    line += _speedup(outcome.speedup_vs_compile, "torch.compile")
    if not outcome.timed:
        line += " (not timed)"
    return line + (f"; {outcome.message}" if outcome.message else "")


def composition(outcome: SearchOutcome) -> str:
    """The chosen spans, e.g. `[0-1] Triton | [2] PyTorch`."""
    parts = []
    for part in outcome.composition:
        start, stop = part["start"], part["stop"] - 1
        steps = f"[{start}]" if start == stop else f"[{start}-{stop}]"
        parts.append(f"{steps} {'Triton' if part['converted'] else 'PyTorch'}")
    return " | ".join(parts) or "-"


def fragment_table(outcome: SearchOutcome) -> str:
    """The fragments as a Markdown table, shortest first."""
    head = [
        "| steps | verdict | correct/judged | kernel ms | eager ms | chosen | note |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = []
    for row in outcome.fragments:
        steps = f"{row.start}" if row.stop - row.start == 1 else f"{row.start}-{row.stop - 1}"
        note = "dropped after a failed run" if row.dropped else row.error
        note = note.replace("|", "/")[:80]
        rows.append(
            f"| {steps} | {row.verdict} | {row.correct}/{row.judged} | {_ms(row.kernel_ms)} "
            f"| {_ms(row.eager_ms)} | {row.chosen or '-'} | {note} |"
        )
    return "\n".join(head + rows)
