"""Training checkpoints: one orbax step directory holds the whole state of a run.

Layout of RUN_DIR/checkpoints/ (orbax `CheckpointManager`):

    <step>/state/   arrays (StandardSave): parameters, optimizer state, step, RNG key data;
                    each host writes its own shards, restore places them on any mesh
    <step>/meta/    JSON (JsonSave): data iterator position, curriculum state, counters,
                    the config's hash, anything small and host-side

A step directory is written under a temporary name and renamed when complete, so a run
killed at any moment leaves only whole checkpoints (`latest_step` never sees a partial one;
leftovers are removed on the next start). The newest `keep` steps are kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

STATE_ITEM = "state"
META_ITEM = "meta"


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be used (missing step, unreadable, other shapes)."""


class Checkpointer:
    """Saves and restores (state pytree, meta dict) pairs by step.

    `every`: `save` writes only on steps divisible by it (or with `force=True`, e.g. the last
    step). `async_save`: the arrays are written in the background while training goes on
    (`wait()` blocks until they are on disk; `close()` waits too).
    """

    def __init__(
        self, directory: Path | str, *, keep: int, every: int, async_save: bool = False
    ) -> None:
        if keep < 1 or every < 1:
            raise ValueError("keep and every must be at least 1")
        self.directory = Path(directory).absolute()
        self.every = every
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            save_interval_steps=1,  # `every` is applied here, so forced saves work alike
            create=True,
            cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save,
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=(STATE_ITEM, META_ITEM)
        )

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def should_save(self, step: int) -> bool:
        return step % self.every == 0

    def save(self, step: int, state: Any, meta: Mapping[str, Any], *, force: bool = False) -> bool:
        """Write `state` (a pytree of arrays) and `meta` (JSON-able) as step `step`.

        Returns whether a checkpoint was started (False off the `every` grid unless forced, or
        when this step is already saved).
        """
        if not (force or self.should_save(step)) or step in self._manager.all_steps():
            return False
        args = ocp.args.Composite(
            **{
                STATE_ITEM: ocp.args.StandardSave(state),
                META_ITEM: ocp.args.JsonSave(dict(meta)),
            }
        )
        return bool(self._manager.save(step, args=args, force=True))

    def restore(self, step: int | None, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """(state, meta) of `step` (None = latest). `abstract_state` is a pytree of
        `jax.ShapeDtypeStruct`s (with shardings) or arrays: the state comes back in its
        structure, dtypes and shardings, on whatever mesh this run uses."""
        step = self._step(step)
        abstract = jax.tree.map(_as_abstract, abstract_state)
        args = ocp.args.Composite(
            **{
                STATE_ITEM: ocp.args.StandardRestore(abstract),
                META_ITEM: ocp.args.JsonRestore(),
            }
        )
        try:
            restored = self._manager.restore(step, args=args)
        except (ValueError, KeyError, FileNotFoundError) as err:
            raise CheckpointError(
                f"{self.directory}/{step}: cannot restore the training state ({err})"
            ) from err
        return restored[STATE_ITEM], dict(restored[META_ITEM])

    def read_meta(self, step: int | None = None) -> dict[str, Any]:
        """Only the JSON part of a checkpoint (cheap: no arrays are read)."""
        step = self._step(step)
        restored = self._manager.restore(
            step, args=ocp.args.Composite(**{META_ITEM: ocp.args.JsonRestore()})
        )
        return dict(restored[META_ITEM])

    def _step(self, step: int | None) -> int:
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointError(f"{self.directory}: no checkpoint to restore")
        elif step not in self._manager.all_steps():
            raise CheckpointError(f"{self.directory}: no checkpoint of step {step}")
        return step

    def wait(self) -> None:
        """Block until every started save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _as_abstract(x: Any) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
