"""The teacher behind the policy interface."""

from __future__ import annotations

import pytest

from learner.policies.base import Policy
from learner.policies.teacher import TeacherPolicy
from synth.teacher import translate
from synth.teacher.prompt import extract_code

from .programs import FOUR_OPS

UNTRANSLATABLE = FOUR_OPS.replace("torch.sigmoid(tensor_3)", "torch.special.erfcx(tensor_3)")


def test_teacher_answers_each_problem_with_copies_of_its_translation() -> None:
    policy = TeacherPolicy()
    assert isinstance(policy, Policy) and policy.name == "teacher"
    answers = policy.propose([FOUR_OPS, UNTRANSLATABLE, FOUR_OPS], samples=3, seed=9)
    assert [len(a) for a in answers] == [3, 3, 3]
    expected = translate(FOUR_OPS).code
    assert {p.code for p in answers[0]} == {expected}
    assert extract_code(answers[0][0].text) == expected
    assert answers[2] == answers[0]
    assert policy.propose([FOUR_OPS], samples=1, seed=1)[0][0] == answers[0][0]


def test_an_untranslatable_problem_is_an_answer_without_code_not_an_error() -> None:
    (answer, _) = TeacherPolicy().propose([UNTRANSLATABLE], samples=2)[0]
    assert answer.code is None and answer.error is not None
    assert answer.error.startswith("not translatable:") and "\n" not in answer.error


def test_samples_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        TeacherPolicy().propose([FOUR_OPS], samples=0)
