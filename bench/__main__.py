"""`python -m bench` (`make bench`): the benchmarks this machine can run, and the GPU ones.

CPU: the program generator's cost per program (`bench.synth_bench`) and a candidate's
first Triton compile in a fork of a cold or warmed zygote (`bench.zygote_compile`).
GPU host: `bench.sandbox_throughput` (verifications per second, timing fidelity, against
a plain harness), `bench.context_contention` (what other processes on the GPU cost a
timed loop), `bench.shared_gpu_spread` (a fixed kernel's speedup beside a training load,
with and without the learner's GPU gate), `bench.teacher_bench` (the teacher's pass rate and speedups by operator
family) and `bench.learner_bench` (decode and SFT step of the policy model).
"""

from __future__ import annotations

import sys

GPU_COMMANDS = (
    "python -m bench.sandbox_throughput --device cuda --out runs/sandbox_throughput.md",
    "python -m bench.context_contention",
    "python -m bench.shared_gpu_spread --repeats 6",
    "python -m bench.teacher_bench --max-seconds 420 --out runs/teacher_bench.md",
    "python -m bench.learner_bench --models 0.5b --out runs/learner_0p5b.json",
    "python -m bench.learner_bench --models 1.5b --out runs/learner_1p5b.json",
)


def main() -> int:
    from bench import synth_bench, zygote_compile

    status = synth_bench.main([]) or 0
    status |= zygote_compile.main([]) or 0
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        print("\nNo GPU here. On a GPU host run:", *GPU_COMMANDS, sep="\n  ")
        return int(status)
    from bench import context_contention, learner_bench, sandbox_throughput, teacher_bench

    status |= sandbox_throughput.main(["--device", "cuda"]) or 0
    status |= context_contention.main([]) or 0
    status |= teacher_bench.main(["--max-seconds", "420"]) or 0
    status |= learner_bench.main(["--models", "0.5b"]) or 0
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
