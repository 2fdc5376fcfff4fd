"""Kernel templates, one module per operator family.

Every template has the same entry point, `emit(module, group)`: it appends one
kernel to the module and the host lines that allocate the group's outputs and
launch it, and hands its output tile to `codegen.Epilogue` so that fused
elementwise operators run before the store.
"""
