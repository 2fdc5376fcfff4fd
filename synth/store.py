"""Crash-safe JSONL output with resume.

Records go to `<out>.partial` (one line each, flushed as written) next to a small
`<out>.partial.json` that says which run they belong to. Only a finished run renames
the partial file onto `<out>` (an atomic `os.replace`), so `<out>` is either absent,
the previous complete file, or the new complete file, never a torn one. Re-running the
same command after an interruption keeps the valid prefix of the partial file (a torn
last line is dropped) and continues from there; because every program depends only on
(seed, index), the resumed file is byte-identical to an uninterrupted one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any


class OutputError(Exception):
    """The output path cannot be written."""


def check_writable(path: Path) -> None:
    parent = path.resolve().parent
    if path.is_dir():
        raise OutputError(f"{path} is a directory")
    if not parent.is_dir():
        raise OutputError(f"directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"directory {parent} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"{path} is not writable")


class ResumableJsonl:
    """Append-only writer of one run's records; `commit()` publishes the file."""

    def __init__(self, path: Path, run: dict[str, Any]) -> None:
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        self.meta = path.with_name(path.name + ".partial.json")
        self.run = run
        self.lines: list[str] = []
        self._file: IO[str] | None = None

    def open(self, limit: int | None = None) -> list[str]:
        """Start or resume; returns the lines (at most `limit`) already written for this
        same run."""
        check_writable(self.path)
        try:
            self.lines = self._resumable_lines()[:limit]
            with open(self.partial, "w", encoding="utf-8") as f:
                f.writelines(line + "\n" for line in self.lines)
            self.meta.write_text(json.dumps(self.run, sort_keys=True))
            self._file = open(self.partial, "a", encoding="utf-8")  # noqa: SIM115 - closed in commit/close
        except OSError as err:
            raise OutputError(f"cannot write {self.partial}: {err.strerror}") from err
        return list(self.lines)

    def _resumable_lines(self) -> list[str]:
        if not (self.partial.is_file() and self.meta.is_file()):
            return []
        try:
            if json.loads(self.meta.read_text()) != json.loads(
                json.dumps(self.run, sort_keys=True)
            ):
                return []
        except (OSError, ValueError):
            return []
        good = []
        with open(self.partial, encoding="utf-8", errors="replace") as f:
            for raw in f:
                if not raw.endswith("\n"):
                    break  # torn last line
                try:
                    json.loads(raw)
                except ValueError:
                    break
                good.append(raw[:-1])
        return good

    def append(self, line: str) -> None:
        assert self._file is not None
        self._file.write(line + "\n")
        self._file.flush()
        self.lines.append(line)

    def commit(self) -> None:
        """Make the finished file visible under its final name, atomically."""
        assert self._file is not None
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        os.replace(self.partial, self.path)
        self.meta.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop without publishing (the partial file stays for a resume)."""
        if self._file is not None:
            self._file.close()
            self._file = None
