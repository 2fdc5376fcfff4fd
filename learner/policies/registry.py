"""A policy from a one-word spec, as the command line names it (`--policy SPEC`).

    teacher                       the teacher's translation (deterministic)
    checkpoint:PATH               our model: a model directory, an HF checkpoint or a run
                                  directory (its model/)
    hosted:BASE_URL#MODEL         an OpenAI-compatible endpoint, e.g.
                                  hosted:https://api.openai.com/v1#gpt-4o or
                                  hosted:http://localhost:8000/v1#Qwen/Qwen2.5-Coder-7B-Instruct;
                                  the key comes from $OPENAI_API_KEY (option api_key_env)

A policy's `name` is the spec it was made from. Options are keyword arguments of the
policy's class; an option given as None is left at the class's default, so a command line
can pass every flag it has and only those set count. Each policy is imported only when asked
for (the checkpoint policy brings jax, the teacher torch).
"""

from __future__ import annotations

import inspect
from typing import Any

from learner.policies.base import Policy, PolicyError

KINDS = ("teacher", "checkpoint", "hosted")
SPEC_HELP = "teacher | checkpoint:PATH | hosted:BASE_URL#MODEL"


def parse_spec(spec: str) -> tuple[str, str]:
    """(kind, argument) of a spec; PolicyError names the accepted forms otherwise."""
    kind, _, argument = spec.strip().partition(":")
    kind = kind.lower()
    if kind not in KINDS:
        raise PolicyError(f"unknown policy {spec!r}; expected {SPEC_HELP}")
    if kind == "teacher" and argument:
        raise PolicyError(f"the teacher policy takes no argument, got {spec!r}")
    if kind != "teacher" and not argument:
        raise PolicyError(f"policy {spec!r} needs an argument; expected {SPEC_HELP}")
    return kind, argument


def _policy_class(kind: str) -> type:
    if kind == "teacher":
        from learner.policies.teacher import TeacherPolicy

        return TeacherPolicy
    if kind == "checkpoint":
        from learner.policies.checkpoint import CheckpointPolicy

        return CheckpointPolicy
    from learner.policies.hosted import HostedPolicy

    return HostedPolicy


def _check_options(cls: type, kind: str, options: dict[str, Any], taken: set[str]) -> None:
    """Refuse an option the class does not take, listing those it does."""
    parameters = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    accepted = [
        name
        for name, p in parameters.items()
        if name not in taken and p.kind is not inspect.Parameter.VAR_POSITIONAL
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        valid = ", ".join(accepted) or "none"
        raise PolicyError(
            f"the {kind} policy takes no option {', '.join(unknown)} (options: {valid})"
        )


def load_policy(spec: str, **options: Any) -> Policy:
    """The policy `spec` names (see the module docstring), made with `options`."""
    kind, argument = parse_spec(spec)
    options = {key: value for key, value in options.items() if value is not None}
    cls = _policy_class(kind)
    if kind == "teacher":
        _check_options(cls, kind, options, set())
        return cls(**options)
    if kind == "checkpoint":
        _check_options(cls, kind, options, {"model_dir"})
        return cls(argument, **options)
    base_url, _, model = argument.partition("#")  # a base URL has no fragment
    named = options.pop("model", None)
    if model and named not in (None, model):
        raise PolicyError(f"{spec!r} names model {model!r} and the option model {named!r}")
    model = model or named or ""
    if not model:
        raise PolicyError(f"policy {spec!r} names no model; expected hosted:BASE_URL#MODEL")
    _check_options(cls, kind, options, {"base_url", "model"})
    return cls(base_url, model, **options)
