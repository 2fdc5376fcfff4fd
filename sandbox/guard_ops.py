"""Which ATen ops a candidate's host code may run, and what a refused op returns instead.

Pure policy for `sandbox.guard`'s dispatch mode, which is on the stack for every call
whose output counts. Host code may allocate, fill with a constant or noise, take views
and read metadata: nothing that turns input values into other values. Any other op is
*refused without running*: its results (and the arguments it would have written) come
back computed from NaN stand-ins of its arguments (the arguments it writes are filled
with NaN): the right shapes, nothing of the real values. The call runs on to its end
whatever it used, so a call that used PyTorch looks like any other to its code; the
refusal is recorded and judged afterwards. An answer that is a Python value (`bool(t)`,
`torch.equal`) is likewise the stand-ins', a constant that says nothing of the tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

# Allocation, constant fills and memory description. Anything else that is not a view
# computes.
ALLOWED_OPS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "zeros",
        "zeros_like",
        "new_zeros",
        "ones",
        "ones_like",
        "new_ones",
        "full",
        "full_like",
        "new_full",
        "zero_",
        "arange",
        "lift_fresh",
        "detach",
        "_unsafe_view",
        "resize_",
        "set_",
        "is_same_size",
        "_has_compatible_shallow_copy_type",
        "is_contiguous",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "record_stream",
    }
)
# Noise: allowed while it takes no tensor but the one it fills (a `normal_` whose mean is
# a tensor computes with it).
RANDOM_OPS = frozenset(
    {
        "rand",
        "randn",
        "randint",
        "randperm",
        "rand_like",
        "randn_like",
        "randint_like",
        "normal_",
        "uniform_",
        "random_",
        "exponential_",
        "bernoulli_",
        "cauchy_",
        "log_normal_",
        "geometric_",
    }
)
# Results that hold whatever their memory held before: NaN in a no-launch call, so that
# a previous call's answer left in a reused block cannot pass for this one's.
UNINITIALISED_OPS = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
)

ALLOW, BLANK, COPY, REFUSE = "allow", "blank", "copy", "refuse"


def category(func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """ALLOW, BLANK (an uninitialised allocation), COPY (`copy_`: allowed inside a launch
    when it only moves bytes) or REFUSE."""
    name = func.overloadpacket.__name__
    if name in UNINITIALISED_OPS:
        return REFUSE if kwargs.get("pin_memory") else BLANK
    if func.is_view or name.startswith("_to_dense"):
        return ALLOW
    if name in ALLOWED_OPS:
        return REFUSE if kwargs.get("pin_memory") else ALLOW
    if name == "fill_":  # a Scalar fill; the Tensor overload copies a value out of memory
        return ALLOW if not isinstance(args[1], torch.Tensor) else REFUSE
    if name in RANDOM_OPS:
        tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        own = 1 if name.endswith("_") else 0
        return ALLOW if len(tensors) == own and not kwargs.get("pin_memory") else REFUSE
    if name == "copy_":
        return COPY
    return REFUSE


def same_bytes(args: tuple[Any, ...]) -> bool:
    """Whether `copy_(dst, src)` only moves bytes: one dtype, shape, layout and device."""
    if len(args) < 2:
        return False
    dst, src = args[0], args[1]
    return (
        isinstance(dst, torch.Tensor)
        and isinstance(src, torch.Tensor)
        and dst.dtype == src.dtype
        and dst.shape == src.shape
        and dst.stride() == src.stride()
        and dst.device == src.device
    )


# NaN written as the bits of a same-size integer. CUDA loads a kernel on its first launch,
# and a candidate process loads the int32 fill when it starts (`timing.bind_clock` zeroes
# its int32 L2-flush buffer): a float32 NaN fill of its own cost the no-op check 46 ms at 8
# busy workers on an H200 and 147 ms at 16, inside the job's share of the GPU.
_NAN_BITS = {
    torch.float32: (torch.int32, 0x7FC00000),
    torch.float16: (torch.int16, 0x7E00),
    torch.bfloat16: (torch.int16, 0x7FC0),
    torch.float64: (torch.int64, 0x7FF8000000000000),
}


def poison(value: Any) -> Any:
    """Fill a tensor (or each in a list) with NaN, or a value far from counts and indices.

    Runs inside `__torch_dispatch__`, where the mode is set aside.
    """
    if isinstance(value, torch.Tensor):
        if value.numel() == 0 or value.device.type == "meta":
            return value
        if value.dtype in _NAN_BITS and value.layout == torch.strided:
            as_int, bits = _NAN_BITS[value.dtype]
            value.view(as_int).fill_(bits)
        elif value.is_floating_point() or value.is_complex():
            value.fill_(float("nan"))
        elif value.dtype == torch.bool:
            value.fill_(True)
        else:  # within the dtype's range
            info = torch.iinfo(value.dtype)
            value.fill_(max(info.min, -123456789) if info.min < 0 else min(info.max, 201))
    elif isinstance(value, list | tuple):
        for item in value:
            poison(item)
    return value


class ValueRead(Exception):
    """A refused op that cannot even run on stand-ins (its answer would be an error)."""


def refused_result(
    func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """What a refused op returns: the op run on NaN stand-ins of its tensor arguments
    (same shapes, strides, dtypes, devices), so its results have the right shapes and
    hold nothing computed from the real values. Arguments it writes are filled with NaN
    first and written for real (in-place and `out=` results stay what they alias).

    Raises `ValueRead` when the op fails on the stand-ins (an index it cannot use).
    """
    flat = tree_flatten((args, kwargs))[0]
    written = {
        id(value)
        for value, writes in zip(flat, _schema_writes(func, args, kwargs), strict=False)
        if writes and isinstance(value, torch.Tensor)
    }

    def stand_in(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if id(value) in written:
            return poison(value)
        blank = torch.empty_strided(
            value.shape, value.stride(), dtype=value.dtype, device=value.device
        )
        return poison(blank)

    stand_args, stand_kwargs = tree_map(stand_in, (args, kwargs))
    try:
        return func(*stand_args, **stand_kwargs)
    except Exception as error:  # noqa: BLE001 - reported as the refusal it is
        raise ValueRead(f"{func} cannot run without the real values") from error


def _schema_writes(
    func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[bool]:
    """For each flattened tensor of (args, kwargs): whether the op writes it."""
    flags: list[bool] = []
    arguments = func._schema.arguments
    for index, value in enumerate(args):
        writes = index < len(arguments) and _writes(arguments[index])
        flags += [writes] * len(tree_flatten(value)[0])
    by_name = {a.name: a for a in arguments}
    for name, value in kwargs.items():
        writes = name in by_name and _writes(by_name[name])
        flags += [writes] * len(tree_flatten(value)[0])
    return flags


def _writes(argument: Any) -> bool:
    return argument.alias_info is not None and bool(argument.alias_info.is_write)
