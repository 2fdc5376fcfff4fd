"""The committed generated code matches the .proto files, and it imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from protos import generate


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools regenerates the code")
    # protoc runs in a process of its own: grpc_tools' bundled protobuf runtime can
    # crash a process that already loaded torch and jax (as a test session has).
    subprocess.run(
        [sys.executable, "-m", "protos.generate", "--out", str(tmp_path)],
        check=True,
        cwd=generate.ROOT,
        capture_output=True,
    )
    written = [tmp_path / Path(p).with_suffix("") for p in generate.PROTO_FILES]
    written = [
        stem.with_name(stem.name + suffix)
        for stem in written
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
    ]
    stale = []
    for path in written:
        assert path.exists(), f"protoc did not write {path.name}"
        relative = path.relative_to(tmp_path)
        committed = generate.ROOT / relative
        assert committed.exists(), f"{relative} is not committed: run `make protos`"
        if committed.read_bytes() != path.read_bytes():
            stale.append(str(relative))
    assert not stale, f"stale generated code (run `make protos`): {stale}"


def test_generated_modules_import() -> None:
    from protos.drtriton.sandbox.v1 import sandbox_pb2 as pb
    from protos.drtriton.sandbox.v1 import sandbox_pb2_grpc

    service = pb.DESCRIPTOR.services_by_name["Sandbox"]
    assert service.full_name == "drtriton.sandbox.v1.Sandbox"
    assert [m.name for m in service.methods] == ["Verify", "VerifyStream", "GetInfo"]
    assert hasattr(sandbox_pb2_grpc, "SandboxStub")
    assert hasattr(sandbox_pb2_grpc, "add_SandboxServicer_to_server")
    request = pb.VerifyRequest(request_id="x", options=pb.VerifyOptions(trials=5, atol=0.0))
    assert pb.VerifyRequest.FromString(request.SerializeToString()) == request
    assert request.options.HasField("atol") and not request.options.HasField("rtol")
