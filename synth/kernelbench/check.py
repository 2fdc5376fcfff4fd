"""Is the rewritten program the Model? Checked on fresh inputs before it is used.

For each seed the Model's own `get_inputs()` draws fresh inputs. On the first seed the
Model keeps the weights it was built with; on the others every parameter is redrawn
with `torch.randn` (buffers keep their values): initial weights such as a norm's ones
and zeros would hide a scale and a shift written the wrong way round. The program takes
the same tensors (parameters after the user inputs) and must return the Model's
outputs, flattened, within tolerance. Finally the program runs on its own
`get_inputs()`, as the sandbox will run it, and must give finite outputs.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

DEFAULT_SEEDS = (0, 1, 2)
RTOL = 1e-4
ATOL = 1e-4
"""Relative to the reference's largest magnitude (at least 1): float32 sums in another
order (a linear layer as matmul + add) differ by rounding only."""


def close(got: Any, want: Any) -> bool:
    """Same shape and dtype, values within tolerance (NaN where the reference has NaN)."""
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        return False
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    return error(got, want) is None


def error(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """Why `got` is not `want` within tolerance, or None."""
    if not (got.is_floating_point() or got.is_complex()):
        return None if torch.equal(got, want) else "integer values differ"
    got64, want64 = got.detach().double(), want.detach().double()
    finite = want64[torch.isfinite(want64)]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    if torch.allclose(got64, want64, rtol=RTOL, atol=ATOL * scale, equal_nan=True):
        return None
    diff = (got64 - want64).abs().nan_to_num(nan=float("inf"))
    return f"max abs error {float(diff.max()):.3g} (scale {scale:.3g})"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        yield


def _outputs(result: Any) -> list[Any]:
    leaves, _ = tree_flatten(result)
    return leaves


def compare_outputs(got: Sequence[Any], want: Sequence[Any]) -> str | None:
    """Why the program's outputs are not the Model's, or None."""
    if len(got) != len(want):
        return f"{len(got)} outputs where the Model has {len(want)}"
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        if not isinstance(w, torch.Tensor):
            return f"the Model's output {index} is a {type(w).__name__}, not a tensor"
        if not isinstance(g, torch.Tensor):
            return f"output {index} is a {type(g).__name__}, not a tensor"
        if g.shape != w.shape or g.dtype != w.dtype:
            return (
                f"output {index} is {list(g.shape)} {g.dtype}, the Model's "
                f"{list(w.shape)} {w.dtype}"
            )
        why = error(g, w)
        if why is not None:
            return f"output {index}: {why}"
    return None


def random_state(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Every parameter redrawn with randn (seeded), buffers as they are."""
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        state[name] = torch.randn(param.shape, generator=generator, dtype=param.dtype)
    for name, buffer in model.named_buffers():
        state[name] = buffer.detach().clone()
    return state


def own_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = {name: p.detach().clone() for name, p in model.named_parameters()}
    state.update({name: b.detach().clone() for name, b in model.named_buffers()})
    return state


def check_program(
    program: Callable[..., Any],
    own_inputs: Callable[[], Sequence[Any]],
    model: torch.nn.Module,
    make_inputs: Callable[[], Sequence[Any]],
    param_feeds: Sequence[tuple[str, Sequence[int] | None]],
    *,
    seeds: Sequence[int] = DEFAULT_SEEDS,
) -> str | None:
    """Why `program` (taking user inputs, then the Model state `param_feeds` names, each in
    the shape given there) is not `model`, or None when it matches on every seed and is
    finite on its own inputs."""
    for position, seed in enumerate(seeds):
        state = own_state(model) if position == 0 else random_state(model, 10_000 + seed)
        torch.manual_seed(seed)
        inputs = list(make_inputs())
        try:
            with _quiet():
                want = _outputs(
                    torch.func.functional_call(model, _copies(state), tuple(_copies(inputs)))
                )
        except Exception as err:  # noqa: BLE001 - the Model itself fails
            return f"the Model fails on seed {seed}: {type(err).__name__}: {err}"
        try:
            with _quiet():
                feeds = [
                    state[t] if shape is None else state[t].reshape(list(shape))
                    for t, shape in param_feeds
                ]
                got = list(program(*inputs, *feeds))
        except Exception as err:  # noqa: BLE001 - the rewrite fails
            return f"the rewritten program fails on seed {seed}: {type(err).__name__}: {err}"
        why = compare_outputs(got, want)
        if why is not None:
            weights = "its own weights" if position == 0 else "random weights"
            return f"the rewritten program differs from the Model (seed {seed}, {weights}): {why}"
    torch.manual_seed(0)
    try:
        with _quiet():
            outputs = list(program(*own_inputs()))
    except Exception as err:  # noqa: BLE001
        return f"the rewritten program fails on its own inputs: {type(err).__name__}: {err}"
    for index, out in enumerate(outputs):
        if out.is_floating_point() and not bool(torch.isfinite(out).all()):
            return (
                f"output {index} is not finite on the program's own inputs "
                "(parameters drawn with torch.randn)"
            )
    return None


def _copies(values: Mapping[str, Any] | Sequence[Any]) -> Any:
    """Fresh copies, so a Model that updates its statistics in place changes nothing."""
    if isinstance(values, Mapping):
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in values.items()}
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]
