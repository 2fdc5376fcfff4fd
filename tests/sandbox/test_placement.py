"""Workers spread over a host's GPUs: which GPU each gets, and what they are told."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest

from sandbox import placement, runner
from sandbox.config import SandboxConfig
from tests.sandbox.test_cli import drtriton


@pytest.mark.parametrize(
    ("workers", "gpus", "expected"),
    [
        (8, ["0", "1", "2", "3"], [("0", 2), ("1", 2), ("2", 2), ("3", 2)]),
        (5, ["0", "1"], [("0", 3), ("1", 2)]),
        (2, ["0", "1", "2", "3"], [("0", 1), ("1", 1)]),  # more GPUs than workers
        (3, ["5"], [("5", 3)]),
    ],
)
def test_workers_go_round_robin(workers: int, gpus: list[str], expected: list[Any]) -> None:
    assert placement.spread(workers, gpus) == expected


def test_chosen_gpus_are_indices_among_the_visible_ones() -> None:
    visible = ["4", "5", "6"]  # e.g. CUDA_VISIBLE_DEVICES=4,5,6
    assert placement.choose_gpus((), visible) == visible
    assert placement.choose_gpus((2, 0), visible) == ["6", "4"]


@pytest.mark.parametrize(
    ("requested", "visible", "fragment"),
    [
        ((3,), ["0", "1"], "GPU index 3 is out of range: 2 GPU(s) visible (0-1)"),
        ((0, 0), ["0", "1"], "repeat"),
        ((), [], "no GPU is visible"),
    ],
)
def test_impossible_choices_say_why(requested: Any, visible: list[str], fragment: str) -> None:
    with pytest.raises(ValueError, match=None) as raised:
        placement.choose_gpus(requested, visible)
    assert fragment in str(raised.value)


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 7")
    assert placement.visible_gpus() == ["3", "7"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert placement.visible_gpus() == ["0", "1"]


def _runner(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, **config: Any) -> runner.JobRunner:
    job_runner = runner.JobRunner(SandboxConfig(job_root=str(tmp_path), **config))
    job_runner.device = "cuda"
    monkeypatch.setattr(placement, "visible_gpus", lambda: ["0", "1", "2"])
    return job_runner


def test_each_gpu_gets_its_workers_and_its_own_job_root(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    groups = _runner(monkeypatch, tmp_path, workers=5, gpus=(2, 0))._gpu_groups()
    assert [(gpu, config.workers) for gpu, config in groups] == [("2", 3), ("0", 2)]
    roots = [config.job_root for _, config in groups]
    assert len(set(roots)) == 2 and all(os.path.basename(r).startswith("gpu-") for r in roots)


def test_one_gpu_keeps_the_runner_s_job_root(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    job_runner = _runner(monkeypatch, tmp_path, workers=4, gpus=(1,))
    ((gpu, config),) = job_runner._gpu_groups()
    assert gpu == "1" and config == job_runner.config


def test_gpus_on_a_cpu_sandbox_are_refused(tmp_path: Any) -> None:
    job_runner = runner.JobRunner(SandboxConfig(device="cpu", job_root=str(tmp_path), gpus=(0,)))
    with pytest.raises(ValueError, match="runs on the CPU"):
        job_runner._gpu_groups()


def test_a_worker_sees_only_its_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    seen: dict[str, str] = {}

    def popen(command: list[str], **kwargs: Any) -> Any:
        seen.update(kwargs["env"])
        return None

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    runner._Worker(SandboxConfig(job_root=str(tmp_path)), "cuda", probe=False, gpu="2")
    assert seen["CUDA_VISIBLE_DEVICES"] == "2"


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--gpus", "zero"], "--gpus takes GPU indices like 0,1"),
        (["--device", "cpu", "--gpus", "0"], "--gpus needs a GPU sandbox"),
    ],
)
def test_bad_gpus_are_usage_errors(argv: list[str], fragment: str) -> None:
    done = drtriton("sandbox", "serve", "--port", "0", *argv, timeout_s=60)
    assert done.returncode == 2
    assert fragment in done.stderr and "Traceback" not in done.stderr


def test_the_triton_seed_is_copied_to_each_gpu_s_root(tmp_path: Any) -> None:
    from sandbox.process import triton_seed_dir

    built = os.path.join(triton_seed_dir(str(tmp_path / "gpu-0")), "cache", "helper.so")
    os.makedirs(os.path.dirname(built))
    with open(built, "w") as handle:
        handle.write("compiled")
    runner._copy_seed(str(tmp_path / "gpu-0"), str(tmp_path / "gpu-1"))
    copied = os.path.join(triton_seed_dir(str(tmp_path / "gpu-1")), "cache", "helper.so")
    with open(copied) as handle:
        assert handle.read() == "compiled"
    runner._copy_seed(str(tmp_path / "none"), str(tmp_path / "gpu-2"))  # no seed: no error
    assert not os.path.exists(triton_seed_dir(str(tmp_path / "gpu-2")))
