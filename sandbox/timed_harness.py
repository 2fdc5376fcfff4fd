"""The candidate harness's timing commands: `stage`, `time` and `fetch`.

Built once by `timing_commands`, in the harness's start-up, before the candidate's module
is imported: every function, method and type these commands use is bound then and their
state lives in closures, so nothing the candidate patches later (the harness's class,
`sandbox.timing`'s functions, `torch.Tensor`'s methods, `torch`'s dtypes) runs in their
place or changes what they read.

- `stage`: the input sets (`sandbox.timed_inputs`), one buffer the grader packed. The
  harness keeps it in host memory and gives the calls a device buffer of its own, blank
  until a set's first call: each set is copied in just before the call that first uses it
  (ahead of a timed run's cache flush, outside its events), so no call can reach a set
  before its turn (a warm-up that computed every set's answer through pointer arithmetic
  from its own inputs, to answer the timed runs with copies, finds blank memory), and no
  candidate kernel, still running or launched later, ever sees the grader's mapping.
- `time`: one loop, every call guarded (`sandbox.guard`), each on the set the grader's
  schedule names (`TimingPlan.schedule`); the outputs of the last `keep` calls kept for the grader's pick, in a ring the calls
  fill (the allocator is given their blocks first, so that no timed run waits for the
  driver to allocate). A host-clock loop marks its end (`loop_done`) before the guard's
  checks, where the grader's clock stops. Afterwards: the clock must be as it was bound
  (`clock_seal`), and no kept output may be an earlier call's memory or an input's
  (`reused_outputs`).
- `fetch`: `keep` lets go of every kept output but the calls the grader drew; `outputs`
  copies one drawn call's outputs into the grader's buffers.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

# Imported with the harness, before the instruments take their baseline of the sandbox's
# modules and classes (`sandbox.guard_integrity`): these are watched from the start.
from sandbox import clock_seal, timed_inputs, timing

Command = Callable[[dict[str, Any]], None]


def timing_commands(harness: Any) -> dict[str, Command]:
    """The three commands, bound to `harness` (a `sandbox.candidate.Harness` whose
    instruments and clock are in place, and no candidate code loaded yet)."""
    import torch

    seal, time_cuda, time_wall = clock_seal.seal, timing.time_cuda, timing.time_wall
    clock = harness.clock
    reply, refused, classify = harness.reply, harness.refused, harness.classify
    send, dumps = harness._send, harness._dumps
    instruments, device = harness.instruments, harness.device
    device_tensors, tensor_of = harness._inputs, harness._tensor
    sync, settle, storage_ptr = harness._sync, harness._settle, harness._storage_ptr
    base = torch._C.TensorBase
    narrow, view, numel, size = base.narrow, base.view, base.numel, base.size
    copy, detach, dtype_of = base.copy_, base.detach, base.dtype.__get__
    zero, uint8, host = base.zero_, torch.uint8, torch.device("cpu")
    empty, tensor_type, out_of_memory = torch.empty, torch.Tensor, torch.cuda.OutOfMemoryError
    dtypes = {
        str(d).removeprefix("torch."): d for d in vars(torch).values() if type(d) is torch.dtype
    }
    unpack, reused, kept_calls = (
        timed_inputs.unpack,
        timed_inputs.reused_outputs,
        timed_inputs.kept_calls,
    )
    perf, count, list_, tuple_, type_, len_, int_ = (
        time.perf_counter,
        itertools.count,
        list,
        tuple,
        type,
        len,
        int,
    )
    clock_changed = seal(clock) if clock is not None else (lambda: None)
    state: dict[str, Any] = {"sets": [], "inputs_at": [], "loops": {}, "room": ([], 0)}
    # The staged sets: the host copy, the calls' device buffer, each set's span of both,
    # and the sets copied onto the device so far.
    staged: dict[str, Any] = {"host": None, "device": None, "spans": [], "on_device": set()}

    def tensors(result: Any) -> list[Any]:
        """The tensors a call returned (a plain tensor, or a plain list or tuple of them)."""
        if type_(result) is tensor_type:
            return [result]
        if type_(result) in (list_, tuple_):
            return [value for value in result if type_(value) is tensor_type]
        return []

    def stage(msg: dict[str, Any]) -> None:
        state["sets"], state["inputs_at"] = [], []
        state["loops"].clear()
        staged.update(host=None, device=None, spans=[], on_device=set())
        sync()  # no kernel of an earlier command still running when the sets come
        given = device_tensors(msg["inputs"])[0]
        kept = empty(numel(given), dtype=uint8, device=host)
        copy(kept, given)
        # Blank before it goes: a private copy returns to PyTorch's cache, where a later
        # allocation of the candidate's would find every set; a mapping is let go.
        zero(given)
        del given
        buffer = empty(numel(kept), dtype=uint8, device=device)
        zero(buffer)
        staged.update(host=kept, device=buffer, spans=msg["spans"])
        state["sets"] = unpack(buffer, msg["layout"], narrow=narrow, view=view, dtypes=dtypes)
        state["inputs_at"] = [storage_ptr(buffer)] if numel(buffer) else []
        sync()
        reply(ok=True)

    def bring(index: int) -> None:
        """Copy set `index` onto the device, the first time a call needs it."""
        if index in staged["on_device"]:
            return
        start, length = staged["spans"][index]
        if length:
            copy(
                narrow(staged["device"], 0, start, length),
                narrow(staged["host"], 0, start, length),
            )
        staged["on_device"].add(index)

    def make_room(outputs: list[dict[str, Any]], count_: int) -> None:
        """Hand the allocator blocks for `count_` sets of outputs, then let them go: the
        calls' own allocations find them cached."""
        try:
            blocks = [
                empty(spec["shape"], dtype=dtypes[spec["dtype"]], device=device)
                for _ in range(count_)
                for spec in outputs
            ]
        except (out_of_memory, KeyError, RuntimeError):
            blocks = []  # the loop allocates as it goes
        del blocks

    def time_(msg: dict[str, Any]) -> None:
        if clock is None:
            reply(ok=False, error_type="sandbox_error", message="timing needs CUDA")
            return
        slot, wall = msg["slot"], bool(msg["wall"])
        runs, warmup = int_(msg["runs"]), int_(msg["warmup"])
        loops = state["loops"]
        loops.pop(slot, None)  # a loop timed again lets go of its earlier outputs
        sets, schedule = state["sets"], msg["schedule"]
        calls = runs + (1 if wall else warmup)
        if len_(schedule) != calls or not all(0 <= i < len_(sets) for i in schedule):
            reply(ok=False, error_type="sandbox_error", message="no such input sets staged")
            return
        keep = max(1, min(int_(msg["keep"]), calls))
        arguments = [sets[i] for i in schedule]
        places = [c % keep for c in range(calls)]
        kept: list[Any] = [None] * keep
        if not wall:  # (a host-clock loop's room is made before the grader's clock starts)
            make_room(msg["outputs"], keep + 1)
            state["room"] = (msg["outputs"], keep + 1)
        next_call, entry = count().__next__, harness.entry
        # The warm-ups' sets (and a host-clock loop's, which its clock must not see
        # arrive) now; each timed run's just before it.
        for index in schedule[: calls - runs] if not wall else schedule:
            bring(index)

        def before_run(run: int) -> None:
            index = schedule[calls - runs + run]
            outside(lambda: bring(index))

        def step() -> None:
            call = next_call()
            kept[places[call]] = entry(*arguments[call])

        started = perf()
        loop = instruments.call("normal", classify, steps=True)
        # Bound before any call: the stretch's attributes are reachable from a call.
        hold, outside = loop.hold, loop.outside
        with loop:
            for inputs in sets:
                hold(inputs)  # (checked for loose ends with the outputs)
            guarded = loop.armed(step)
            if wall:
                times = [time_wall(guarded, clock, runs)]
                # The grader's clock stops here: the stretch's own checks are not the loop's.
                send(dumps({"loop_done": harness.seq}).encode())
            else:
                times = time_cuda(guarded, clock, runs, warmup, before_run)
            for result in kept:
                hold(result)
        if refused(loop.report):
            return
        changed = clock_changed()
        if changed is not None:
            reply(ok=False, error_type="tampering", message=f"the candidate {changed}")
            return
        outputs = {call: kept[call % keep] for call in kept_calls(calls, keep)}
        kept.clear()
        found = reused(
            (
                (call, [storage_ptr(t) for t in tensors(r) if numel(t)])
                for call, r in outputs.items()
            ),
            state["inputs_at"],
        )
        if found is not None:
            earlier, later = found
            what = "an input's memory" if earlier < 0 else f"call {earlier}'s output memory"
            reply(
                ok=False,
                error_type="wrong_output",
                message=f"timed call {later} returned {what}: an answer reused, not computed",
            )
            return
        # Kept for `fetch`, which copies the drawn ones out after the grader's clock stopped.
        loops[slot] = outputs
        # The loop's own duration, for the grader's stage accounting only (never trusted).
        reply(ok=True, times=times, loop_s=perf() - started)

    def fetch(msg: dict[str, Any]) -> None:
        loops = state["loops"]
        for slot, wanted in msg["keep"].items():
            held = loops.get(slot, {})
            loops[slot] = {call: held[call] for call in wanted if call in held}
            del held
            make_room(*state["room"])  # for the next loop, out of its time
        targets = []  # held until the copies are done (see `Harness.run`)
        for slot, specs in msg["outputs"].items():
            result = loops.get(slot, {}).get(msg["calls"][slot])
            if type_(result) is tensor_type:
                result = [result]
            if type_(result) not in (list_, tuple_):
                continue  # nothing written: the grader's buffers read as NaN
            for value, spec in zip(result, specs, strict=False):
                if (
                    type_(value) is tensor_type
                    and list_(size(value)) == spec["shape"]
                    and dtype_of(value) is dtypes.get(spec["dtype"])
                    and numel(value)
                ):
                    targets.append(tensor_of(spec, shared=True))
                    copy(targets[-1], detach(value))
        settle()
        del targets
        reply(ok=True)

    return {"stage": stage, "time": time_, "fetch": fetch}
