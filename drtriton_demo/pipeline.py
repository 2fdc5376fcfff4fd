"""The demo's loop: check the machine, run each stage (or reuse it), report.

    code = run_demo(DemoOptions(out=Path("runs/demo")))

One sandbox server serves every stage: started (on loopback) when the first stage that
needs it runs, stopped when the demo ends, however it ends. Each stage prints one line with
its time; the last prints the report (Markdown, on stdout) and the paths written.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drtriton_demo import environment, manifest, results
from drtriton_demo.execute import StageFailed, command_line, run_command
from drtriton_demo.sizes import DemoSize, size_for
from drtriton_demo.stages import STAGE_NAMES, DemoPaths, Stage, plan

WEAK_ISOLATION_FLAG = "--allow-weak-isolation"


class DemoError(RuntimeError):
    """The demo cannot start (bad options, an unusable environment or output directory)."""


@dataclass(frozen=True)
class DemoOptions:
    out: Path = Path("runs/demo")
    size: str = "auto"  # smoke | cpu | gpu | auto (gpu with a GPU, else cpu)
    device: str = "auto"  # auto | cpu | cuda
    seed: int = 0
    fresh: bool = False
    until: str | None = None  # the last stage to run (default: all, then the report)


def _write_atomic(path: Path, text: str) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------------------------
# Steps between stages (light, in this process)
# --------------------------------------------------------------------------------------------


def write_search_problems(size: DemoSize, paths: DemoPaths) -> None:
    """Each generated search program as its own problem file (what `drtriton search` reads)."""
    for level, count in size.search_programs:
        if count < 1:
            continue
        lines = paths.search_programs(level).read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        if len(records) < count:
            raise StageFailed(f"{paths.search_programs(level)}: {len(records)} of {count} programs")
        paths.problems.mkdir(parents=True, exist_ok=True)
        for index, record in enumerate(records[:count]):
            _write_atomic(paths.problem_file(level, index), record["source"])


def check_pairs(size: DemoSize, paths: DemoPaths) -> None:
    """At least one verified pair, or there is nothing to train on."""
    count = 0
    for level, n in size.train_programs:
        path = paths.pairs_file(level)
        if n > 0 and path.is_file():
            count += sum(1 for line in path.read_text().splitlines() if line.strip())
    if count == 0:
        raise StageFailed(
            f"the teacher verified no pair: nothing to train on (logs in {paths.logs})"
        )


AFTER: dict[str, Callable[[DemoSize, DemoPaths], None]] = {
    "programs": write_search_problems,
    "pairs": check_pairs,
}


# --------------------------------------------------------------------------------------------
# The sandbox server
# --------------------------------------------------------------------------------------------


class Server:
    """The demo's sandbox server, started on first use: its address and GPU gate."""

    def __init__(self, stack: contextlib.ExitStack, size: DemoSize, device: str, console: Any):
        self._stack, self._size, self._device, self._console = stack, size, device, console
        self.values: dict[str, str] | None = None
        self.time: results.StageTime | None = None  # how long it took to start

    def start(self) -> dict[str, str]:
        """{"server": "127.0.0.1:PORT", "gpu_gate": DIR or ""}, starting it if needed."""
        if self.values is None:
            started = time.monotonic()
            with self._console.status("starting the sandbox server"):
                address, weak = self._serve()
            self.values = {"server": address, "gpu_gate": self._gate()}
            note = " (WEAKER isolation)" if weak else ""
            title = f"sandbox server at {address}, {self._size.workers} workers on {self._device}"
            self.time = results.StageTime(
                "sandbox", title + note, time.monotonic() - started, "ran"
            )
            self._console.print(
                f"[green]✓[/] {'sandbox':<9}{self.time.seconds:7.1f} s  {title}"
                + (f" [bold yellow]{note}[/]" if weak else "")
            )
        return self.values

    def _serve(self) -> tuple[str, bool]:
        from learner.train.verify import SandboxUnreachable, start_local_sandbox

        options = {"workers": self._size.workers, "device": self._device}
        try:
            return self._stack.enter_context(start_local_sandbox(**options)), False
        except SandboxUnreachable as err:
            if WEAK_ISOLATION_FLAG not in str(err):
                raise StageFailed(str(err)) from None
            self._console.print(f"[bold yellow]warning:[/] {err}")
            self._console.print(
                "[bold yellow]The demo continues with WEAKER isolation on this host: candidate "
                "kernels run without the full jail (see sandbox/THREAT_MODEL.md).[/]"
            )
        try:
            address = start_local_sandbox(**options, allow_weak_isolation=True)
            return self._stack.enter_context(address), True
        except SandboxUnreachable as err:
            raise StageFailed(str(err)) from None

    def _gate(self) -> str:
        """On a GPU, the server's GPU gate, so RL's own GPU work never runs beside a timed
        loop; "" on a CPU (nothing is timed) or where it cannot be found."""
        if self._device != "cuda":
            return ""
        from learner.rl.gpu_share import local_gate_dir
        from learner.train.config import ConfigError

        try:
            return local_gate_dir()
        except ConfigError as err:
            self._console.print(f"[bold yellow]warning:[/] {err}; RL runs without the GPU gate")
            return ""


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def terminate_as_interrupt() -> Any:
    """SIGTERM stops the demo as Ctrl-C does: the running stage's process and the sandbox
    server are stopped too, and the stage is resumed by the next run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _selected(stages: list[Stage], until: str | None) -> list[Stage]:
    if until is None:
        return stages
    if until not in STAGE_NAMES:
        raise DemoError(f"--until {until}: one of {', '.join(STAGE_NAMES)}")
    return stages[: STAGE_NAMES.index(until) + 1]


def _run_stage(
    stage: Stage,
    size: DemoSize,
    paths: DemoPaths,
    values: dict[str, str],
    env: dict[str, str],
    console: Any,
) -> None:
    for output in stage.outputs:
        output.mkdir(parents=True, exist_ok=True)
    count = len(stage.commands)
    started = time.monotonic()
    with console.status(f"{stage.name}: {stage.title}") as status:
        for index, command in enumerate(stage.commands):
            args = command.filled(values)
            step = f"[{index + 1}/{count}] " if count > 1 else ""

            def show(line: str, step: str = step) -> None:
                elapsed = time.monotonic() - started
                status.update(f"[bold]{stage.name}[/] {step}{elapsed:.0f} s  [dim]{line[:100]}[/]")

            show(command_line(args))
            run_command(
                args,
                paths.logs / f"{stage.name}-{index}.log",
                env=env,
                on_output=show,
                ok=command.ok,
            )
    after = AFTER.get(stage.name)
    if after is not None:
        after(size, paths)


def _clean(stage: Stage, paths: DemoPaths) -> None:
    manifest.remove_outputs(paths.root, stage.outputs)
    for log in paths.logs.glob(f"{stage.name}-*.log"):
        log.unlink()


def _server_values(stage: Stage, server: Server, times: list[results.StageTime]) -> dict[str, str]:
    """The server's address (and gate) for a stage that needs it; its start time recorded."""
    if not stage.needs_server:
        return {}
    if server.values is None:
        server.start()
        if server.time is not None:
            times.append(server.time)
    return server.values or {}


def run_stages(
    stages: list[Stage],
    size: DemoSize,
    paths: DemoPaths,
    record: manifest.Manifest,
    server: Server,
    env: dict[str, str],
    console: Any,
) -> list[results.StageTime]:
    """Run, resume or reuse each stage in order; one line each. StageFailed stops the loop."""
    times: list[results.StageTime] = []
    upstream_ran = False
    for stage in stages:
        key = stage.key(size)
        previous = record.record(stage.name)
        exists = all(p.exists() for p in stage.outputs)
        decision = manifest.decide(previous, key, exists, upstream_ran)
        if decision == manifest.REUSE:
            seconds = float((previous or {}).get("seconds", 0.0))
            times.append(results.StageTime(stage.name, stage.title, seconds, "reused"))
            console.print(f"[dim]↺ {stage.name:<9}{seconds:7.1f} s  {stage.title} (reused)[/]")
            continue
        if decision == manifest.CLEAN:
            _clean(stage, paths)
        record.started(stage.name, key)
        started = time.monotonic()
        try:
            values = _server_values(stage, server, times)
            started = time.monotonic()
            _run_stage(stage, size, paths, values, env, console)
        except StageFailed as err:
            seconds = time.monotonic() - started
            console.print(f"[bold red]✗ {stage.name:<9}{seconds:7.1f} s  failed:[/] {err}")
            raise
        seconds = time.monotonic() - started
        record.finished(stage.name, key, seconds)
        how = "resumed" if decision == manifest.RESUME else "ran"
        times.append(results.StageTime(stage.name, stage.title, seconds, how))
        note = " (resumed)" if how == "resumed" else ""
        console.print(f"[green]✓[/] {stage.name:<9}{seconds:7.1f} s  {stage.title}{note}")
        upstream_ran = True
    return times


def write_report(
    size: DemoSize, device: str, paths: DemoPaths, times: list[results.StageTime], console: Any
) -> tuple[str, list[Path]]:
    """REPORT.md, the speedup curve and both runs' learning curves; (Markdown, paths)."""
    started = time.monotonic()
    gathered = results.collect(size, device, paths, times)
    text = results.markdown(gathered)
    _write_atomic(paths.report, text)
    written = [paths.report, results.write_curve(gathered, paths.curve)]
    from learner.train.plot import PlotError, plot_run

    for run in (paths.sft, paths.rl):
        try:
            written.append(plot_run(run))
        except PlotError as err:
            console.print(f"[yellow]no learning curves:[/] {err}")
    console.print(f"[green]✓[/] {'report':<9}{time.monotonic() - started:7.1f} s  {paths.report}")
    return text, written


def run_demo(options: DemoOptions, console: Any = None, out: Callable[[str], None] = print) -> int:
    """The whole demo (see the module docstring); 0 when every stage ran, 1 when one failed.
    DemoError for what stops it before any stage runs."""
    from rich.console import Console

    console = console or Console(stderr=True, soft_wrap=True)
    try:
        environment.check_packages()
        device = environment.resolve_device(options.device)
        size = size_for(options.size, device)
        paths = DemoPaths(Path(options.out).resolve())
        record = manifest.Manifest.open(paths.root, fresh=options.fresh)
    except (environment.EnvironmentProblem, manifest.ManifestError, ValueError) as err:
        raise DemoError(str(err)) from None
    stages = _selected(plan(size, paths, options.seed), options.until)
    record.size = size.name
    console.print(
        f"[bold]DRTriton demo[/]: {size.name} size on {device}, {size.estimate}; "
        f"writing {paths.root}"
    )
    env = environment.stage_environment(device)
    total = time.monotonic()
    with contextlib.ExitStack() as stack:
        stack.enter_context(terminate_as_interrupt())
        server = Server(stack, size, device, console)
        try:
            times = run_stages(stages, size, paths, record, server, env, console)
        except StageFailed:
            console.print("[bold red]The demo stopped.[/] Rerun the same command to resume.")
            return 1
        if options.until is not None and options.until != STAGE_NAMES[-1]:
            console.print(f"stopped after {options.until} (--until); rerun without it to go on")
            return 0
        text, written = write_report(size, device, paths, times, console)
    out(text)
    console.print(f"[bold]done in {time.monotonic() - total:.0f} s.[/] Written:")
    models = [paths.sft / "model", paths.trained_model]
    for path in [*written, paths.pairs, *models, paths.search, paths.eval, paths.logs]:
        console.print(f"  {path}")
    return 0
