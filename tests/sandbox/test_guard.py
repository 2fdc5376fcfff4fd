"""The candidate process's instruments (`sandbox.guard`), driven directly.

Installing them is for the life of a process (wrappers, an audit hook), so each scenario
runs in one fresh subprocess that prints what each guarded stretch reported. The attack
suite (`tests/sandbox/attacks`) runs the same instruments through the real grader.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandbox.guard import CallReport

REPO_ROOT = Path(__file__).resolve().parents[2]

_SCENARIOS = r"""
import _thread, gc, json, sys, time, weakref
import torch
import sandbox.candidate as harness  # imported before the guard, as in a candidate process
# Held where the guard's scan for aliases does not look: a thread it cannot refuse.
native = {"start": _thread.start_new_thread}
from sandbox import guard
inst = guard.install()
why = lambda error: "runtime_error"
reports = {}

def run(name, body, undo=lambda: None, steps=False):
    with inst.call("normal", why, steps=steps) as call:
        body(call)
    undo()  # trusted code, unguarded: the next scenario starts clean
    failure = call.report.failure()
    reports[name] = None if failure is None else [failure[0], failure[1][-160:]]

def finaliser(call):
    out = torch.empty(3)
    weakref.finalize(out, print, "late")
    call.hold([out])

def gc_callback(call):
    gc.callbacks.append(lambda phase, info: None)

hold = _thread.allocate_lock()

def thread_left(call):
    hold.acquire()
    native["start"](hold.acquire, ())
    time.sleep(0.2)

def thread_gone():
    hold.release()
    time.sleep(0.2)

class Unprintable(Exception):
    def __str__(self):
        raise ValueError("no")

def unprintable(call):
    raise Unprintable()

def caught(call):
    try:
        torch.ones(2).tolist()
    except Exception:
        pass

def audit_hook(call):
    sys.addaudithook(lambda event, args: None)

tail = harness._tail

def rebind(call):
    harness._tail = lambda text, limit=0: text

def unbind():
    harness._tail = tail

def clean(call):
    out = torch.empty(4)
    call.hold([out.view(2, 2)])

src, dst = torch.arange(4.0), torch.zeros(4)

def harness_copy(call):
    call.armed(lambda: None)()
    call.outside(lambda: dst.copy_(src))

def copy_in_a_call(call):
    call.armed(lambda: call.outside(lambda: dst.copy_(src)))()

def copy_unwrapped(call):
    dst.copy_(src)

run("harness_copy", harness_copy, steps=True)
copied = dst.tolist()
run("copy_in_a_call", copy_in_a_call, steps=True)
run("copy_unwrapped", copy_unwrapped, steps=True)
reports["copied"] = copied
run("finaliser", finaliser)
run("gc_callback", gc_callback, gc.callbacks.clear)
run("thread_left", thread_left, thread_gone)
run("unprintable", unprintable)
run("caught", caught)
run("audit_hook", audit_hook)
run("rebind", rebind, unbind)
run("clean_after", clean)
print(json.dumps(reports))
"""


@pytest.fixture(scope="module")
def reports() -> dict[str, list[str] | None]:
    done = subprocess.run(
        [sys.executable, "-c", _SCENARIOS],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT / "tests",  # a working directory with no files of the grader's
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("scenario", "verdict", "says"),
    [
        ("finaliser", "tampering", "weak references"),
        ("gc_callback", "tampering", "gc.callbacks"),
        ("thread_left", "tampering", "left a thread running"),
        ("unprintable", "runtime_error", "str() failed"),
        ("caught", "torch_fallback", "Tensor.tolist"),
        ("audit_hook", "tampering", "audit hook"),
        ("rebind", "tampering", "sandbox.candidate._tail"),
    ],
)
def test_what_a_call_leaves_behind_is_reported(
    reports: dict[str, list[str] | None], scenario: str, verdict: str, says: str
) -> None:
    """Each way of leaving code to run after the call, or of hiding a refusal, is reported
    by the stretch it happened in (a refusal the candidate caught included)."""
    found = reports[scenario]
    assert found is not None and found[0] == verdict and says in found[1], found


def test_the_harness_copies_between_a_loops_calls(reports: dict[str, Any]) -> None:
    """`Stretch.outside` runs the harness's own copy between calls unrefused (a timed run's
    inputs are brought onto the device there); the same copy unwrapped, or reached from
    inside a call, is refused."""
    assert reports["harness_copy"] is None
    assert reports["copied"] == [0.0, 1.0, 2.0, 3.0]
    assert reports["copy_unwrapped"][0] == "no_triton_kernel"  # refused, and no launch
    assert "aten.copy_" in reports["copy_unwrapped"][1]
    assert reports["copy_in_a_call"][0] == "tampering"
    assert "harness's own work" in reports["copy_in_a_call"][1]


def test_a_clean_call_after_them_reports_nothing(reports: dict[str, list[str] | None]) -> None:
    assert reports["clean_after"] is None


@pytest.mark.parametrize(
    ("report", "verdict"),
    [
        # PyTorch refused (the call ran on) and no launch at all: no Triton kernel.
        (CallReport(0, ("torch_fallback", "aten.mm", True), None, None), "no_triton_kernel"),
        (CallReport(2, ("torch_fallback", "aten.mm", True), None, None), "torch_fallback"),
        # An escape hatch cut the call short: its launch count says nothing.
        (CallReport(0, ("torch_fallback", "Tensor.numpy", False), None, None), "torch_fallback"),
        # What the call left behind outranks what it did.
        (CallReport(1, ("torch_fallback", "x", True), "rebound os.open", None), "tampering"),
        (CallReport(1, None, None, ("resource_limit", "MemoryError")), "resource_limit"),
        (CallReport(0, None, None, None), None),
    ],
)
def test_a_reports_verdict(report: CallReport, verdict: str | None) -> None:
    failure = report.failure()
    assert (failure[0] if failure else None) == verdict


GCC = "/usr/bin/gcc"
TRITON_BUILD = [GCC, "/tmp/t/main.c", "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", "/tmp/t/m.so"]
TRITON_BUILD += ["-lcuda", "-l:libcuda.so.1", "-L/usr/lib64", "-I/usr/include/python3.12"]


@pytest.mark.parametrize(
    ("event", "args", "allowed"),
    [
        ("subprocess.Popen", (GCC, TRITON_BUILD, None, None), True),
        ("subprocess.Popen", ("/opt/x/ptxas", ["/opt/x/ptxas", "-v", "a.ptx"], None, None), True),
        # a C compiler told to run another program, or to load one into itself
        (
            "subprocess.Popen",
            (GCC, [GCC, "-wrapper", "/usr/bin/python3,-c,0", "a.c"], None, None),
            False,
        ),
        ("subprocess.Popen", (GCC, [GCC, "-B/tmp/evil", "a.c"], None, None), False),
        ("subprocess.Popen", (GCC, [GCC, "-fplugin=/tmp/p.so", "a.c"], None, None), False),
        ("subprocess.Popen", (GCC, [GCC, "@/tmp/options"], None, None), False),
        # a shell, whatever its command line starts with
        ("os.system", ("ptxas; python3 -c 0",), False),
        ("subprocess.Popen", ("/bin/sh", ["/bin/sh", "-c", "gcc a.c"], None, None), False),
        ("subprocess.Popen", ("/usr/bin/python3", ["/usr/bin/python3"], None, None), False),
    ],
)
def test_only_tritons_own_compiler_calls_pass_inside_a_launch(
    event: str, args: tuple, allowed: bool
) -> None:
    """The one exemption for starting programs (inside a launch, on a GPU) admits Triton's
    compilers with Triton's arguments, never a way to run something else."""
    from sandbox.guard_hatches import _COMPILER_TOOLS, _is_compiler_call

    assert _is_compiler_call(event, args, _COMPILER_TOOLS) is allowed


_JOB_DIR_OPENS = r"""
import json, os, sys, tempfile, types
from sandbox import guard_hatches, process

home = sys.argv[1]
os.environ.update(process.candidate_env(home, "cpu"))  # the candidate's TMPDIR
tempfile.tempdir = None
state = types.SimpleNamespace(armed=True, in_launch=True)  # a launch compiling a kernel
refused = []

def refuse(verdict, why, raising=True):
    refused.append([verdict, why])
    if raising:
        raise PermissionError(why)

guard_hatches.add_audit_hook(state, refuse, {}, home)
outcome = {}
with tempfile.NamedTemporaryFile("w", suffix=".ptx") as scratch:  # as Triton's compile does
    scratch.write("ptx")
    scratch.flush()
    outcome["scratch_in"] = os.path.dirname(scratch.name)
    with open(scratch.name) as again:
        again.read()
outcome["scratch_refused"] = list(refused)
try:
    open(os.path.join(home, "inputs.bin"), "rb")
except PermissionError:
    pass
outcome["grader_refused"] = refused[-1] if refused else None
print(json.dumps(outcome))
"""


def test_a_launch_writes_temporary_files_but_never_opens_the_graders(tmp_path: Path) -> None:
    """Triton's compile on a GPU writes and reads temporary files under TMPDIR inside a
    launch: the candidate's TMPDIR is a folder of its own in the job directory, which the
    audit hook lets through, while the grader's files beside it stay refused."""
    from sandbox.isolation import JOB_TMP_DIR

    (tmp_path / JOB_TMP_DIR).mkdir()
    (tmp_path / "inputs.bin").write_bytes(b"\0" * 16)
    done = subprocess.run(
        [sys.executable, "-c", _JOB_DIR_OPENS, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(outcome["scratch_in"]).resolve() == (tmp_path / JOB_TMP_DIR).resolve()
    assert outcome["scratch_refused"] == []
    assert outcome["grader_refused"][0] == "torch_fallback"
    assert "inputs.bin" in outcome["grader_refused"][1]
