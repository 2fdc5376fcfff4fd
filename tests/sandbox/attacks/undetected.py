"""Each attack run with nothing to stop it: does it return the right answer?

`python -m tests.sandbox.attacks.undetected PROBLEM_AND_ATTACK_JSON` (with
TRITON_INTERPRET=1) imports torch and Triton once, then forks a child per attack that
loads it, calls it the way a naive harness would (the call, a pause, type checks, the
copy out through `detach`), and compares with the reference. Prints one JSON object:
attack path -> [] when right, else what was wrong. Children fork so that one attack's
patches (builtins, Tensor methods, hooks) never reach another.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from typing import Any

import torch

SEEDS = (11, 12)


def _load(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _naive_copy_out(result: Any) -> list[torch.Tensor]:
    """What a harness without the guard's precautions did after a call returned."""
    time.sleep(0.05)  # the reply being written: a timer may fire
    if isinstance(result, torch.Tensor):
        result = [result]
    copies = []
    for value in result:
        copy = torch.empty_like(value)
        copy.copy_(value.detach())
        copies.append(copy)
    return copies


def _problems(problem_path: str, attack_path: str) -> list[str]:
    problem = _load(problem_path, "problem")
    attack = _load(attack_path, "attack")
    found = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        inputs = problem.get_inputs()
        expected = problem.fused_operator(*[x.clone() for x in inputs])
        got = _naive_copy_out(attack.triton_fused_operator(*inputs))
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            if g.shape != e.shape or not torch.allclose(g, e, atol=1e-4, rtol=1e-4):
                found.append(f"seed {seed} output {i} is wrong")
    return found


def _in_child(problem_path: str, attack_path: str) -> list[str]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            found = _problems(problem_path, attack_path)
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            found = [f"{type(error).__name__}: {str(error)[:300]}"]
        os.write(write, json.dumps(found).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b'["the child died"]')


def main() -> None:
    from sandbox.interpreter_check import interpreter_problem

    problem = interpreter_problem()
    if problem:
        print(json.dumps({"interpreter": problem}))
        return
    pairs = json.loads(sys.argv[1])
    print(json.dumps({attack: _in_child(problem, attack) for problem, attack in pairs}))


if __name__ == "__main__":
    main()
