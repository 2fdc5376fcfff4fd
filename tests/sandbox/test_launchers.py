"""Shared Triton launchers: only signatures Triton could produce, built from our own C.

On the CPU nothing is launched, so the two halves are driven directly: the
candidate's hook (what it asks, and its fallback) and the grader's answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import triton
from triton.backends.nvidia import driver
from triton.runtime import build

from sandbox import launchers
from sandbox.guard_hatches import _OWN_FOLDERS
from sandbox.isolation import JOB_TMP_DIR
from sandbox.launchers import LAUNCHER, LauncherCache, launcher_source, valid_signature


@pytest.mark.parametrize(
    "signature",
    [
        ["*fp32", "*fp32", "i32", "constexpr"],
        ["*kfp16", ["i32", "i64"], "fp32", "u1", "*bf16"],
        ["*fp8e4nv", "i64"],
    ],
)
def test_real_signatures_are_accepted(signature: list[Any]) -> None:
    assert valid_signature(signature)


@pytest.mark.parametrize(
    "signature",
    [
        ['i32); system("id"); (void'],
        ["tensordesc<fp32[64, 64]>"],
        ["nvTmaDesc"],
        "*fp32",
        [1, 2],
        ["*fp32"] * 300,
        [[[[["i32"]]]]],
    ],
)
def test_anything_else_is_refused(signature: Any) -> None:
    assert not valid_signature(signature)


def test_the_grader_generates_what_the_candidate_would_compile() -> None:
    # Triton passes the kernel's own argument names; only the types shape the C.
    named = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    ours = launcher_source(list(named.values()))
    assert ours == driver.make_launcher({(3,): 1024}, named, None)


@pytest.fixture
def hooked(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The candidate hook installed, with every change undone afterwards."""
    monkeypatch.setattr(driver, "make_launcher", driver.make_launcher)
    monkeypatch.setattr(triton.knobs.build, "impl", None)
    asked: list[dict[str, Any]] = []
    return asked


def _write_launcher_source(tmp_path: Path) -> str:
    source = driver.make_launcher({}, {"x": "*fp32", "n": "i32"}, None)
    path = tmp_path / f"{LAUNCHER}.c"
    path.write_text(source)
    return str(path)


def test_the_candidate_takes_the_graders_build(
    hooked: list[dict[str, Any]], tmp_path: Path
) -> None:
    built = tmp_path / "from-grader.so"
    built.write_bytes(b"shared library")

    def ask(request: dict[str, Any]) -> dict[str, Any]:
        hooked.append(request)
        return {"path": str(built)}

    launchers.install_candidate_hook(ask)
    src = _write_launcher_source(tmp_path)
    srcdir = tmp_path / "build"
    srcdir.mkdir()
    result = triton.knobs.build.impl(LAUNCHER, src, str(srcdir), [], [], [])
    assert hooked == [{"build_launcher": ["*fp32", "i32"]}]
    assert Path(result).parent == srcdir and Path(result).read_bytes() == b"shared library"


def test_the_candidate_compiles_itself_when_the_grader_cannot(
    hooked: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled: list[str] = []

    def local_build(name: str, *args: Any) -> str:
        assert triton.knobs.build.impl is None  # no recursion into the hook
        compiled.append(name)
        return "local.so"

    monkeypatch.setattr(build, "_build", local_build)
    launchers.install_candidate_hook(lambda request: {"error": "no"})
    src = _write_launcher_source(tmp_path)
    assert triton.knobs.build.impl(LAUNCHER, src, str(tmp_path), [], [], []) == "local.so"
    # Other modules are never sent to the grader.
    assert triton.knobs.build.impl("cuda_utils", src, str(tmp_path), [], [], []) == "local.so"
    assert compiled == [LAUNCHER, "cuda_utils"]
    assert triton.knobs.build.impl is not None  # the hook is back in place


def test_the_graders_answer_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = LauncherCache(str(tmp_path / "cache"))
    job_dir = tmp_path / "job"
    (job_dir / JOB_TMP_DIR).mkdir(parents=True)
    assert "error" in cache.answer({"build_launcher": ["bogus type"]}, str(job_dir))

    def fake_compile(c_file: str, scratch: str) -> str:
        assert Path(c_file).read_text() == launcher_source(["*fp32", "i32"])
        out = Path(scratch) / "built.so"
        out.write_bytes(b"built once")
        return str(out)

    monkeypatch.setattr(LauncherCache, "_compile", staticmethod(fake_compile))
    first = cache.answer({"build_launcher": ["*fp32", "i32"]}, str(job_dir))
    assert Path(first["path"]).read_bytes() == b"built once"
    # In the candidate's own folder: what its code may open in the job directory.
    assert Path(first["path"]).parent == job_dir / JOB_TMP_DIR
    assert JOB_TMP_DIR in _OWN_FOLDERS

    def broken_compile(c_file: str, scratch: str) -> str:
        raise RuntimeError("gcc missing")

    monkeypatch.setattr(LauncherCache, "_compile", staticmethod(broken_compile))
    # Cached: the same signature is not built again.
    assert "path" in cache.answer({"build_launcher": ["*fp32", "i32"]}, str(job_dir))
    assert "gcc missing" in cache.answer({"build_launcher": ["*fp16"]}, str(job_dir))["error"]


def test_a_launcher_is_never_written_through_the_candidates_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The candidate owns its job directory and may make its folder a symlink to a host
    directory: the grader then writes nothing, and the candidate compiles for itself."""
    cache = LauncherCache(str(tmp_path / "cache"))
    elsewhere, job_dir = tmp_path / "host", tmp_path / "job"
    elsewhere.mkdir()
    job_dir.mkdir()
    (job_dir / JOB_TMP_DIR).symlink_to(elsewhere)

    def fake_compile(c_file: str, scratch: str) -> str:
        out = Path(scratch) / "built.so"
        out.write_bytes(b"built")
        return str(out)

    monkeypatch.setattr(LauncherCache, "_compile", staticmethod(fake_compile))
    assert "error" in cache.answer({"build_launcher": ["*fp32", "i32"]}, str(job_dir))
    assert list(elsewhere.iterdir()) == []


def test_a_graders_candidates_ask_it_for_launchers(tmp_path: Path) -> None:
    from sandbox.config import SandboxConfig
    from sandbox.grader import Grader

    grader = Grader(SandboxConfig(device="cpu", job_root=str(tmp_path)), "cpu")
    try:
        grader.launchers = LauncherCache(str(tmp_path / "launchers"))  # as on a GPU
        proc = grader.take_process()
        assert proc.launchers is grader.launchers
        assert grader.spares and grader.spares[0].launchers is grader.launchers
        proc.close()
    finally:
        grader.close()


def test_requests_on_the_pipe_are_answered_until_the_reply_comes() -> None:
    """The grader serves a candidate's launcher requests while it waits for a reply."""
    import json
    import threading
    import time
    from multiprocessing import Pipe
    from types import SimpleNamespace

    from sandbox.process import MAX_LAUNCHER_REQUESTS, CandidateProcess

    ours, theirs = Pipe(duplex=True)
    asked: list[Any] = []

    class Cache:
        def answer(self, request: dict[str, Any], job_dir: str) -> dict[str, Any]:
            asked.append(request["build_launcher"])
            return {"path": f"{job_dir}/launcher.so"}

    proc = CandidateProcess.__new__(CandidateProcess)
    proc.conn, proc.launchers, proc.launcher_requests = ours, Cache(), 0
    proc.job_dir, proc.proc = "/job", SimpleNamespace(poll=lambda: None)
    answers: list[Any] = []

    def candidate() -> None:
        for _ in range(MAX_LAUNCHER_REQUESTS + 1):
            theirs.send_bytes(json.dumps({"build_launcher": ["*fp32", "i32"]}).encode())
            answers.append(theirs.recv())
        theirs.send_bytes(json.dumps({"ok": True, "launches": 1}).encode())

    thread = threading.Thread(target=candidate)
    thread.start()
    reply = proc._receive(time.monotonic() + 30)
    thread.join(10)
    assert reply == {"ok": True, "launches": 1}
    assert len(asked) == MAX_LAUNCHER_REQUESTS  # past the cap the candidate builds its own
    assert answers[0] == {"path": "/job/launcher.so"} and "error" in answers[-1]
