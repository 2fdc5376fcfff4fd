"""Device meshes and partition rules kept as data.

One `Mesh` with two axes: `fsdp` (parameters and the batch are split along it, weights are
all-gathered per layer) and `tp` (heads and the MLP's inner dimension are split along it).
A model file lists `(regex over the parameter path, logical axes per dimension)`; this module
turns those rules into `NamedSharding`s. A dimension that an axis does not divide evenly stays
whole (Qwen2's two KV heads on a `tp` of 4, say), so the same rules serve any mesh shape.

Multi-host: call `initialize_distributed()` (which is `jax.distributed.initialize`) in every
process before anything else touches jax; `jax.devices()` then lists every host's devices and
`make_mesh` spans them all. Loading reads each host's own shards, saving is orbax's collective
save, and the sampler gathers its outputs to every host.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXES: tuple[str, str] = ("fsdp", "tp")

Axes = tuple[str | None, ...]
Rules = Sequence[tuple[str, Axes]]


def make_mesh(fsdp: int = -1, tp: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `(fsdp, tp)` mesh over `devices` (all devices by default); -1 means "the rest"."""
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if tp < 1 or n % tp:
        raise ValueError(f"tp={tp} does not divide the {n} devices")
    if fsdp == -1:
        fsdp = n // tp
    if fsdp * tp != n:
        raise ValueError(f"mesh fsdp={fsdp} x tp={tp} does not match the {n} devices")
    return Mesh(np.asarray(devices).reshape(fsdp, tp), AXES)


def fit_spec(shape: Sequence[int], axes: Axes, axis_sizes: dict[str, int]) -> PartitionSpec:
    """`axes` as a PartitionSpec, dropping any mesh axis that does not divide its dimension."""
    if len(axes) != len(shape):
        raise ValueError(f"rule axes {axes} do not match a rank-{len(shape)} array")
    spec: list[str | None] = []
    for dim, axis in zip(shape, axes, strict=True):
        size = axis_sizes.get(axis, 1) if axis else 1
        spec.append(axis if axis and size > 1 and dim % size == 0 else None)
    return PartitionSpec(*spec)


def match_rule(path: str, rules: Rules) -> Axes:
    """The axes of the first rule whose regex matches the whole dotted parameter path."""
    for pattern, axes in rules:
        if re.fullmatch(pattern, path):
            return axes
    raise KeyError(f"no partition rule matches parameter {path!r}")


def param_sharding(path: str, shape: Sequence[int], rules: Rules, mesh: Mesh) -> NamedSharding:
    """The sharding of one parameter under `rules` on `mesh`."""
    return NamedSharding(mesh, fit_spec(shape, match_rule(path, rules), dict(mesh.shape)))


def batch_sharding(mesh: Mesh, shape: Sequence[int]) -> NamedSharding:
    """Leading (batch) dimension over `fsdp` when it divides, everything else replicated."""
    axes: Axes = ("fsdp",) + (None,) * (len(shape) - 1)
    return NamedSharding(mesh, fit_spec(shape, axes, dict(mesh.shape)))


def constrain(x: jax.Array, axes: Axes) -> jax.Array:
    """Pin an activation's layout under the mesh set by `jax.set_mesh`; a no-op without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(AXES) <= set(mesh.axis_names):
        return x
    spec = fit_spec(x.shape, axes, dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True)))
    if all(a is None for a in spec):
        return x
    return jax.lax.with_sharding_constraint(x, spec)


def check_rules_cover(paths: Iterable[str], rules: Rules) -> None:
    """Raise if some parameter has no rule (a new module must come with its sharding)."""
    for path in paths:
        match_rule(path, rules)


def initialize_distributed(
    coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> None:
    """Join a multi-process JAX job (one process per host, or per GPU).

    On Cloud TPU, SLURM, Open MPI and Kubernetes JobSets the arguments are found on their own;
    elsewhere pass the coordinator's `host:port`, the process count and this process's index
    (or set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID).
    """
    jax.distributed.initialize(coordinator, num_processes, process_id)
