"""A grader worker process: owns one Grader and serves jobs from the runner.

The runner talks to it over a pipe (both sides are trusted code). The worker never
runs candidate code itself; it starts a jailed candidate process per job and keeps
spares started ahead so the job does not pay for importing torch and Triton.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import uuid
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from sandbox.config import SandboxConfig

if TYPE_CHECKING:
    from sandbox.gpu_gate import GpuGate


def probe_isolation(grader: Any) -> list[dict[str, Any]]:
    """Start a real candidate process and see which walls hold."""
    import time

    from sandbox.isolation import features as isolation_features
    from sandbox.process import CandidateDied

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    outside = f"/tmp/drtriton-probe-{uuid.uuid4().hex}"
    proc = grader.take_process()
    features: list[dict[str, Any]] = []
    try:
        ready = proc.wait_ready(time.monotonic() + 180)
        reply = proc.request(
            time.monotonic() + 30, cmd="probe", port=listener.getsockname()[1], outside_path=outside
        )
        try:
            listener.accept()
            accepted = True
        except BlockingIOError:
            accepted = False
        features = isolation_features(
            ready,
            reply,
            connected=bool(reply.get("connected") or accepted),
            wrote_outside=os.path.exists(outside),
        )
    except CandidateDied as death:
        log = proc.log_tail().strip().splitlines()[-3:]
        detail = death.message + (": " + " | ".join(log) if log else "")
        features = [{"name": "candidate_start", "available": False, "detail": detail}]
    finally:
        proc.close()
        listener.close()
        if os.path.exists(outside):
            os.unlink(outside)
    return features


def self_test(device: str) -> str:
    """'' when the device computes correctly, else what went wrong."""
    import torch

    try:
        a = torch.randn(256, 256, device=device, dtype=torch.float64)
        b = a @ torch.linalg.inv(a)
        err = float((b - torch.eye(256, device=device, dtype=torch.float64)).abs().max())
        return "" if err < 1e-6 else f"self-test matmul error {err:.3g}"
    except Exception as err:  # noqa: BLE001
        return f"self-test failed: {type(err).__name__}: {err}"


def held_self_test(gate: GpuGate | None, device: str) -> str:
    """`self_test` with a share of the GPU: its kernels must not run beside a timed loop."""
    with gate.shared() if gate is not None else contextlib.nullcontext():
        return self_test(device)


# Verdicts after which the GPU is checked again: a candidate that crashed or hung
# may have left the device unhealthy. Otherwise every SELF_TEST_EVERY jobs.
_SUSPECT_VERDICTS = frozenset({"runtime_error", "timeout", "resource_limit", "sandbox_error"})
SELF_TEST_EVERY = 32


def warm_torch_compile(device: str) -> None:
    """Pay torch.compile's one-off start-up (imports, first compile) before the first job."""
    import torch

    with contextlib.suppress(Exception), torch.no_grad():
        torch.compile(lambda x: torch.relu(x) * 2)(torch.randn(8, device=device))


# Tests hold a worker's start-up this many seconds (a signal during start-up must not wait).
START_DELAY_ENV = "DRTRITON_TEST_WORKER_START_DELAY_S"


def worker_main(conn: Connection, config: SandboxConfig, device: str, probe: bool) -> None:
    if os.environ.get(START_DELAY_ENV):
        import time

        time.sleep(float(os.environ[START_DELAY_ENV]))
    from sandbox.grader import Grader, Job
    from sandbox.zygote import ZygoteError

    os.environ.pop("TRITON_INTERPRET", None)
    grader = Grader(config, device)
    try:
        grader.prestart()
    except ZygoteError as err:  # candidates cannot run on this host: say why, once
        conn.send({"ready": False, "error": str(err)})
        grader.close()
        return
    health = held_self_test(grader.gate, device)
    features = probe_isolation(grader) if probe else []
    if device == "cuda":
        warm_torch_compile(device)
    grader.prestart()
    conn.send(
        {"ready": True, "features": features, "health": health, "provenance": grader.provenance}
    )
    jobs = 0
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:
                break
            if message is None:
                break
            seq = message.pop("seq", None)  # echoed: the runner checks replies stay in step
            job = Job(**message)
            result = grader.grade(job)
            jobs += 1
            if device == "cuda" and (
                result.verdict in _SUSPECT_VERDICTS or jobs % SELF_TEST_EVERY == 0
            ):
                health = held_self_test(grader.gate, device)
            conn.send({"result": dataclasses.asdict(result), "health": health, "seq": seq})
            grader.prestart()
    finally:
        grader.close()


def main() -> None:
    import argparse
    import json

    parser = argparse.ArgumentParser(description="A sandbox grader worker (started by JobRunner).")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--config", required=True, help="SandboxConfig as JSON")
    parser.add_argument("--probe", action="store_true")
    args = parser.parse_args()
    fields = json.loads(args.config)
    config = SandboxConfig(**{**fields, "gpus": tuple(fields.get("gpus", ()))})
    worker_main(Connection(args.fd), config, args.device, args.probe)


if __name__ == "__main__":
    main()
