"""Policy specs: parsing, options, and the class each names (imported only when named)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from learner.policies import registry
from learner.policies.base import PolicyError
from learner.policies.hosted import HostedPolicy

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("teacher", ("teacher", "")),
        (" Teacher ", ("teacher", "")),
        ("checkpoint:runs/x/model", ("checkpoint", "runs/x/model")),
        ("checkpoint:C:/models/m", ("checkpoint", "C:/models/m")),
        ("hosted:http://h:8000/v1#org/model", ("hosted", "http://h:8000/v1#org/model")),
    ],
)
def test_parse_spec(spec: str, expected: tuple[str, str]) -> None:
    assert registry.parse_spec(spec) == expected


@pytest.mark.parametrize("spec", ["", "gpt-4", "teacher:x", "checkpoint:", "hosted:"])
def test_bad_specs_say_what_is_accepted(spec: str) -> None:
    with pytest.raises(PolicyError, match="teacher|argument"):
        registry.parse_spec(spec)


def test_hosted_specs() -> None:
    policy = registry.load_policy("hosted:http://h:8000/v1#org/m", temperature=0.2, top_p=None)
    assert isinstance(policy, HostedPolicy)
    assert policy.name == "hosted:http://h:8000/v1#org/m"
    assert (policy.model, policy.url) == ("org/m", "http://h:8000/v1/chat/completions")
    assert policy.temperature == 0.2 and policy.top_p == 1.0
    named = registry.load_policy("hosted:http://h/v1", model="m2")
    assert named.model == "m2"
    with pytest.raises(PolicyError, match="names no model"):
        registry.load_policy("hosted:http://h/v1")
    with pytest.raises(PolicyError, match="and the option model"):
        registry.load_policy("hosted:http://h/v1#a", model="b")
    with pytest.raises(PolicyError, match="takes no option batch"):
        registry.load_policy("hosted:http://h/v1#a", batch=4)


def test_teacher_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    """The teacher is found by its module and class name; options it lacks are refused."""
    import types

    class TeacherPolicy:
        name = "teacher"

        def propose(self, problems, samples=1, seed=0):  # pragma: no cover - not called
            return []

    module = types.ModuleType("learner.policies.teacher")
    module.TeacherPolicy = TeacherPolicy  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "learner.policies.teacher", module)
    assert isinstance(registry.load_policy("teacher", temperature=None), TeacherPolicy)
    with pytest.raises(PolicyError, match="teacher policy takes no option temperature"):
        registry.load_policy("teacher", temperature=0.5)


def test_loading_the_registry_imports_no_heavy_part() -> None:
    code = (
        "import sys, learner.policies.registry as r; r.load_policy('hosted:http://h/v1#m');"
        "print(sorted(m for m in ('jax', 'torch', 'triton') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
