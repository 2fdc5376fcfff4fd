"""Triton's kernel launchers, compiled once per signature by trusted code and shared.

The first launch of every kernel signature makes Triton compile a small C launcher
with gcc: about a second of CPU, in every fresh candidate process, for launchers
that differ only by argument types. Candidates cannot share a cache (one could
plant a poisoned library for the next), so the grader builds them instead: the
candidate's harness asks for the launcher of a *signature* (argument types, not C
source), the grader checks the types, generates the C with Triton's own
`make_launcher`, compiles it into a cache only graders write, and hands the
candidate a copy. What a candidate asks for can only ever be a launcher Triton
itself would have generated; anything unusual is compiled by the candidate itself,
as before. Only on CUDA (the interpreter launches nothing).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import sysconfig
import tempfile
from collections.abc import Callable
from typing import Any

from sandbox import safe_fs
from sandbox.isolation import JOB_TMP_DIR

LAUNCHER = "__triton_launcher"
# Scalar and pointer types as Triton spells them ("*fp32", "i32", "u1", "*kfp16", ...).
_SIMPLE_TYPE = re.compile(r"^\*?k?(i|u|fp|bf)(1|8|16|32|64)$|^\*?k?fp8e[0-9a-z]+$|^constexpr$")
MAX_ARGUMENTS = 256


def valid_signature(signature: Any) -> bool:
    """A list of argument types (nested lists for tuples) Triton could have produced."""
    count = 0

    def check(item: Any, depth: int) -> bool:
        nonlocal count
        if isinstance(item, list):
            return depth < 4 and all(check(x, depth + 1) for x in item)
        count += 1
        return isinstance(item, str) and bool(_SIMPLE_TYPE.match(item)) and count <= MAX_ARGUMENTS

    return isinstance(signature, list) and check(signature, 0)


def _as_tuples(item: Any) -> Any:
    return tuple(_as_tuples(x) for x in item) if isinstance(item, list) else item


def _as_lists(item: Any) -> Any:
    return [_as_lists(x) for x in item] if isinstance(item, tuple) else item


def launcher_source(signature: list[Any]) -> str:
    """The C source Triton generates for kernels with these argument types."""
    from triton.backends.nvidia.driver import make_launcher

    return make_launcher({}, dict(enumerate(_as_tuples(s) for s in signature)), None)


class LauncherCache:
    """The grader's side: builds launchers into `cache_dir` (written by graders only)."""

    def __init__(self, cache_dir: str) -> None:
        self.cache_dir = cache_dir
        os.makedirs(cache_dir, exist_ok=True)

    @staticmethod
    def _compile(c_file: str, scratch: str) -> str:
        """gcc, exactly as Triton runs it for a launcher; returns the library's path."""
        from triton.backends.nvidia.driver import include_dirs, libraries, library_dirs
        from triton.runtime import build

        return build._build(LAUNCHER, c_file, scratch, library_dirs(), include_dirs, libraries, [])

    def _build(self, source: str) -> str:
        key = hashlib.sha256(source.encode()).hexdigest()
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        path = os.path.join(self.cache_dir, f"{key}{suffix}")
        if os.path.exists(path):
            return path
        with tempfile.TemporaryDirectory(dir=self.cache_dir) as scratch:
            c_file = os.path.join(scratch, f"{LAUNCHER}.c")
            with open(c_file, "w") as handle:
                handle.write(source)
            built = self._compile(c_file, scratch)
            os.replace(built, path)  # atomic: graders building the same one race harmlessly
        return path

    def answer(self, request: dict[str, Any], job_dir: str) -> dict[str, Any]:
        """Reply to a candidate's `build_launcher` request; never raises."""
        signature = request.get("build_launcher")
        if not valid_signature(signature):
            return {"error": "unsupported signature"}
        try:
            built = self._build(launcher_source(signature))
            with open(built, "rb") as handle:
                library = handle.read()
            # Into the candidate's own folder of the job directory (what its code may open
            # there): a new name, written through descriptors (`sandbox.safe_fs`), never
            # through a name it may have made a symlink.
            name = safe_fs.unique_name("launcher-", f"-{os.path.basename(built)}")
            job_fd = safe_fs.open_dir(job_dir)
            try:
                dir_fd = safe_fs.open_subdir(job_fd, JOB_TMP_DIR)
            finally:
                os.close(job_fd)
            try:
                safe_fs.write_new(dir_fd, name, library)
            finally:
                os.close(dir_fd)
            return {"path": os.path.join(job_dir, JOB_TMP_DIR, name)}
        except Exception as err:  # noqa: BLE001 - the candidate then compiles it itself
            return {"error": f"{type(err).__name__}: {str(err)[:300]}"}


def install_candidate_hook(ask: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """In the candidate process, before its code loads: ask the grader for launchers.

    `ask` sends one request on the grader's pipe and returns the answer.
    """
    import triton
    from triton.backends.nvidia import driver
    from triton.runtime import build

    signatures: dict[str, list[Any]] = {}
    make_launcher = driver.make_launcher

    def recording_make_launcher(constants: Any, signature: Any, tensordesc_meta: Any) -> str:
        source = make_launcher(constants, signature, tensordesc_meta)
        if not tensordesc_meta:
            signatures[source] = [_as_lists(s) for s in signature.values()]
        return source

    def build_impl(
        name: str,
        src: str,
        srcdir: str,
        library_dirs: list[str],
        include_dirs: list[str],
        libraries: list[str],
    ) -> str:
        if name == LAUNCHER:
            with open(src) as handle:
                signature = signatures.get(handle.read())
            if signature is not None and valid_signature(signature):
                answer = ask({"build_launcher": signature})
                if answer.get("path"):
                    target = os.path.join(srcdir, f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}")
                    shutil.copyfile(answer["path"], target)
                    return target
        previous, triton.knobs.build.impl = triton.knobs.build.impl, None
        try:
            return build._build(name, src, srcdir, library_dirs, include_dirs, libraries, [])
        finally:
            triton.knobs.build.impl = previous

    driver.make_launcher = recording_make_launcher
    with contextlib.suppress(AttributeError):
        triton.knobs.build.impl = build_impl
