"""The wire contract: `drtriton.sandbox.v1` and its generated Python code.

Import the generated modules as
`from protos.drtriton.sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc`;
`protos/generate.py` says how they are produced and kept fresh.
"""
