"""Regenerate the committed protobuf/gRPC Python code from the .proto files.

Policy: the generated modules are committed (a sandbox host needs no grpcio-tools),
and a test regenerates them into a temporary directory and fails if the committed
copies are stale. Run `make protos` (or `python -m protos.generate`) after editing
a .proto file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_FILES = ("protos/drtriton/sandbox/v1/sandbox.proto",)


def generate(out_dir: Path = ROOT) -> list[Path]:
    """Run protoc (from grpcio-tools) and return the files it wrote."""
    from grpc_tools import protoc  # dev dependency only

    include = Path(protoc.__file__).parent / "_proto"
    for proto in PROTO_FILES:
        args = [
            "protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(ROOT / proto),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")
    written = []
    for proto in PROTO_FILES:
        stem = Path(proto).with_suffix("")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            written.append(out_dir / f"{stem}{suffix}")
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT, help="output root (default: repo)")
    args = parser.parse_args()
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
