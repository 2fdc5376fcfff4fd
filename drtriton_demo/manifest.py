"""What an earlier run of the demo finished, and what this run may therefore reuse.

OUT/demo.json records, per stage, the key of what it did (`Stage.key`), whether it finished
and how long it took. A stage is reused when it finished with the same key, its outputs are
still there and nothing before it ran again; it is resumed (its outputs kept, since every
`drtriton` command it runs continues where it stopped) when it started with the same key but
did not finish; otherwise its outputs are removed and it runs from scratch.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

VERSION = 1
REUSE, RESUME, CLEAN = "reuse", "resume", "clean"
Decision = Literal["reuse", "resume", "clean"]


class ManifestError(ValueError):
    """The output directory is not the demo's (or its record is unreadable)."""


def decide(
    record: dict[str, Any] | None, key: str, outputs_exist: bool, upstream_ran: bool
) -> Decision:
    """Reuse, resume or clean one stage (see the module docstring)."""
    if upstream_ran or record is None or record.get("key") != key:
        return CLEAN
    if record.get("done") and outputs_exist:
        return REUSE
    return RESUME


@dataclass
class Manifest:
    """OUT/demo.json: {"version", "size", "stages": {name: {"key", "done", "seconds"}}}."""

    path: Path
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    size: str = ""

    @staticmethod
    def open(root: Path, *, fresh: bool) -> Manifest:
        """The manifest of `root`, made empty with `fresh` (the directory is cleared).
        ManifestError for a directory that holds files but no demo record: never cleared."""
        path = root / "demo.json"
        if root.exists() and not root.is_dir():
            raise ManifestError(f"{root} is a file, not a directory")
        if root.is_dir() and any(root.iterdir()) and not path.is_file():
            raise ManifestError(
                f"{root} holds files but no demo.json: not a demo directory, choose another --out"
            )
        if fresh and root.is_dir():
            shutil.rmtree(root)
        root.mkdir(parents=True, exist_ok=True)
        if not path.is_file():
            return Manifest(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ManifestError(f"{path}: unreadable ({err}); rerun with --fresh") from None
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ManifestError(f"{path}: not a demo record of this version; rerun with --fresh")
        return Manifest(path, dict(data.get("stages") or {}), str(data.get("size") or ""))

    def record(self, name: str) -> dict[str, Any] | None:
        return self.stages.get(name)

    def started(self, name: str, key: str) -> None:
        self.stages[name] = {"key": key, "done": False}
        self.save()

    def finished(self, name: str, key: str, seconds: float) -> None:
        self.stages[name] = {"key": key, "done": True, "seconds": round(seconds, 1)}
        self.save()

    def save(self) -> None:
        """Atomically: a temporary file beside demo.json, renamed over it."""
        text = json.dumps({"version": VERSION, "size": self.size, "stages": self.stages}, indent=2)
        fd, temp = tempfile.mkstemp(prefix=".demo.json.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(text + "\n")
            os.replace(temp, self.path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise


def remove_outputs(root: Path, outputs: tuple[Path, ...]) -> None:
    """Delete a stage's outputs; refuses any path outside the demo directory."""
    base = root.resolve()
    for path in outputs:
        resolved = path.resolve()
        if resolved == base or base not in resolved.parents:
            raise ManifestError(f"refusing to remove {path}: outside {root}")
        if resolved.is_dir():
            shutil.rmtree(resolved)
        elif resolved.exists():
            resolved.unlink()
