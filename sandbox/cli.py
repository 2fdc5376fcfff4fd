"""`drtriton verify`, `drtriton sandbox serve` and `drtriton sandbox info`.

Registration imports only argparse: handlers import grpc, torch and the runner when
they run. Exit status of `verify`: 0 the kernel is correct, 1 the kernel was
rejected, 2 the job could not be judged (usage, unreachable server, sandbox error),
with one line on stderr and never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.result import VerifyResult

EXIT_CORRECT = 0
EXIT_REJECTED = 1
EXIT_ERROR = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `verify` and `sandbox {serve,info}` to the `drtriton` command."""
    _add_verify(subparsers)
    _add_sandbox(subparsers)


def _add_verify(subparsers: argparse._SubParsersAction) -> None:
    """`drtriton verify`: one command for both local and server grading, so a caller
    switches between them with `--server` alone."""
    verify = subparsers.add_parser(
        "verify",
        help="verify a Triton candidate against a problem (locally or on a server)",
        description="Verify CANDIDATE.py against PROBLEM.py. Exit 0: correct; "
        "1: the kernel was rejected; 2: it could not be judged.",
    )
    verify.add_argument("problem", type=Path, metavar="PROBLEM.py")
    verify.add_argument("candidate", type=Path, metavar="CANDIDATE.py")
    verify.add_argument(
        "--server", metavar="HOST:PORT", help="a sandbox server or fleet (comma-separated)"
    )
    _add_judging_options(verify)
    verify.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="local mode only"
    )
    verify.add_argument(
        "--allow-weak-isolation",
        action="store_true",
        help="local mode: run even where the host lacks isolation features",
    )
    verify.add_argument(
        "--timeout", type=float, default=600, metavar="S", help="server mode: call deadline"
    )
    verify.add_argument(
        "--retries", type=int, default=2, help="server mode: retries when unavailable or busy"
    )
    verify.add_argument("--json", action="store_true", help="print one JSON object")
    _add_client_security(verify)
    verify.set_defaults(handler=_verify)


def _add_judging_options(verify: argparse.ArgumentParser) -> None:
    """How a job is judged: the options that travel with it to `sandbox.api.verify` or a
    server alike (see `_verify`), kept together so both modes accept the same set."""
    verify.add_argument("--trials", type=int, default=5, help="random correctness cases")
    verify.add_argument("--no-timing", action="store_true", help="skip timing")
    verify.add_argument("--atol", type=float, help="absolute tolerance")
    verify.add_argument("--rtol", type=float, help="relative tolerance")
    verify.add_argument("--seed", type=int, help="seed of the random inputs")
    verify.add_argument("--format", choices=("auto", "functional", "kernelbench"), default="auto")
    verify.add_argument("--time-budget", type=float, metavar="S", help="job budget in seconds")


def _add_sandbox(subparsers: argparse._SubParsersAction) -> None:
    """`drtriton sandbox {serve,info}`; a bare `drtriton sandbox` prints its help and
    exits 2, since it is a usage error."""
    sandbox = subparsers.add_parser("sandbox", help="run or query a sandbox server")
    commands = sandbox.add_subparsers(dest="sandbox_command", metavar="COMMAND")
    sandbox.set_defaults(handler=lambda _args: sandbox.print_help() or EXIT_ERROR)
    _add_serve(commands)
    _add_info(commands)


def _add_serve(commands: argparse._SubParsersAction) -> None:
    """`drtriton sandbox serve`: where to listen, what to run on, and who may call."""
    serve = commands.add_parser(
        "serve",
        help="serve the Sandbox gRPC service",
        description="Serve Verify/VerifyStream/GetInfo, gRPC health and reflection. "
        "Prints 'listening on HOST:PORT' first; SIGTERM or Ctrl-C drains and exits 0.",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=50051, help="0 picks a free port")
    serve.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    _add_serve_capacity(serve)
    serve.add_argument(
        "--allow-weak-isolation",
        action="store_true",
        help="serve even where the host lacks isolation features (they are listed)",
    )
    serve.add_argument(
        "--log-level", default="WARNING", choices=("DEBUG", "INFO", "WARNING", "ERROR")
    )
    _add_server_security(serve)
    serve.set_defaults(handler=_serve)


def _add_serve_capacity(serve: argparse.ArgumentParser) -> None:
    """How much the server grades at once and holds waiting; `_serve` checks the counts,
    which argparse cannot bound."""
    serve.add_argument("--workers", type=int, help="jobs graded at once (all GPUs together)")
    serve.add_argument(
        "--gpus",
        metavar="I,J,...",
        help="GPUs the workers spread over, round robin (indices among the visible ones; "
        "default: every visible GPU)",
    )
    serve.add_argument(
        "--spares",
        type=int,
        help="candidate processes each worker keeps started ahead (default 1; on a GPU each "
        "holds a CUDA context)",
    )
    serve.add_argument("--queue", type=int, help="jobs waiting at most (then RESOURCE_EXHAUSTED)")
    serve.add_argument(
        "--job-timeout", type=float, metavar="S", help="default and maximum job budget"
    )


def _add_info(commands: argparse._SubParsersAction) -> None:
    """`drtriton sandbox info`: ask a running server what it is, with the same access
    flags as `verify --server`."""
    info = commands.add_parser("info", help="show a server's device, workers and isolation")
    info.add_argument("--server", required=True, metavar="HOST:PORT")
    info.add_argument("--timeout", type=float, default=10, metavar="S")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    _add_client_security(info)
    info.set_defaults(handler=_info)


def _add_server_security(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group(
        "clients",
        "A --host that is not loopback needs TLS and client tokens (or --insecure). "
        "Tokens are read from a file or an environment variable, never from the command line.",
    )
    group.add_argument("--tls-cert", metavar="PEM", help="the server's certificate chain")
    group.add_argument("--tls-key", metavar="PEM", help="the server's private key")
    group.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        help="mutual TLS: every client must show a certificate signed by this CA",
    )
    group.add_argument(
        "--token-file",
        metavar="PATH",
        help="client tokens, one a line: TOKEN or NAME TOKEN (NAME is the client in the audit log)",
    )
    group.add_argument(
        "--token-env", metavar="VAR", help="an environment variable holding the client token"
    )
    group.add_argument(
        "--insecure",
        action="store_true",
        help="serve a non-loopback address without TLS or tokens (a loud warning)",
    )
    group.add_argument(
        "--max-in-flight-per-client",
        type=int,
        default=0,
        metavar="N",
        help="a client's requests being graded or queued at once (0: no limit; "
        "then RESOURCE_EXHAUSTED)",
    )
    group.add_argument(
        "--max-source-bytes",
        type=int,
        metavar="N",
        help="problem and candidate together, per request (default 4 MiB; then INVALID_ARGUMENT)",
    )
    group.add_argument(
        "--audit-log", metavar="PATH", help="append one JSON line per finished request"
    )


def _add_client_security(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "server access",
        "TLS and the client token of a server beyond loopback (the token: --token-file, "
        "else $DRTRITON_SANDBOX_TOKEN)",
    )
    group.add_argument("--tls", action="store_true", help="TLS, trusting the system's roots")
    group.add_argument("--tls-ca", metavar="PEM", help="TLS, trusting this CA")
    group.add_argument("--tls-cert", metavar="PEM", help="mutual TLS: this client's certificate")
    group.add_argument("--tls-key", metavar="PEM", help="mutual TLS: this client's private key")
    group.add_argument(
        "--tls-server-name", metavar="NAME", help="the name the server's certificate carries"
    )
    group.add_argument("--token-file", metavar="PATH", help="a file holding the client token")


def _fail(message: str) -> int:
    print(f"drtriton: error: {' '.join(message.split())}", file=sys.stderr)
    return EXIT_ERROR


def _json_safe(value: Any) -> Any:
    """Strict JSON: non-finite floats (an Inf error, a NaN speedup) become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _print_json(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(_json_safe(obj), allow_nan=False) + "\n")
    sys.stdout.flush()


def exit_status(result: VerifyResult) -> int:
    if result.correct:
        return EXIT_CORRECT
    if result.infrastructure_failure:
        return EXIT_ERROR
    return EXIT_REJECTED


# -- verify -----------------------------------------------------------------------------


def _verify(args: argparse.Namespace) -> int:
    sources: list[str] = []
    for path in (args.problem, args.candidate):
        try:
            sources.append(path.read_text())
        except OSError as err:
            return _fail(f"cannot read {path}: {err.strerror or err}")
    from sandbox.config import MAX_TRIALS

    if not 1 <= args.trials <= MAX_TRIALS:
        return _fail(f"--trials must be between 1 and {MAX_TRIALS}")
    options: dict[str, Any] = {
        "trials": args.trials,
        "timing": not args.no_timing,
        "atol": args.atol,
        "rtol": args.rtol,
        "seed": args.seed,
        "format": args.format,
        "time_budget_s": args.time_budget,
    }
    try:
        if args.server:
            result = _verify_remote(args, sources[0], sources[1], options)
        else:
            result = _verify_local(args, sources[0], sources[1], options)
    except Exception as err:  # noqa: BLE001 - infrastructure: one line, never a traceback
        message = _describe(err)
        if args.json:
            from sandbox.result import VerifyResult

            _print_json(VerifyResult(verdict="sandbox_error", message=message).to_json_dict())
        return _fail(message)

    if args.json:
        _print_json(result.to_json_dict())
    else:
        _print_report(result)
    status = exit_status(result)
    if status == EXIT_ERROR:
        print(
            f"drtriton: error: not judged ({result.verdict}): {' '.join(result.message.split())}",
            file=sys.stderr,
        )
    return status


def _describe(err: BaseException) -> str:
    from sandbox.errors import WeakIsolationError

    if isinstance(err, WeakIsolationError):
        hint = "" if "--allow-weak-isolation" in str(err) else " (pass --allow-weak-isolation)"
        return f"weak isolation: {err}{hint}"
    text = str(err) or type(err).__name__
    return text if type(err).__module__.startswith("sandbox") else f"{type(err).__name__}: {text}"


def _verify_remote(
    args: argparse.Namespace, problem: str, candidate: str, options: dict[str, Any]
) -> VerifyResult:
    from sandbox.client import SandboxClient

    with SandboxClient(
        args.server, timeout_s=args.timeout, max_retries=args.retries, **_client_access(args)
    ) as client:
        return client.verify(problem, candidate, **options)


def _client_access(args: argparse.Namespace) -> dict[str, Any]:
    """`tls` and `token_file` for a SandboxClient from the server-access flags."""
    from sandbox.auth import ClientTls

    tls = None
    if args.tls or args.tls_ca or args.tls_cert or args.tls_key or args.tls_server_name:
        tls = ClientTls(args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)
    return {"tls": tls, "token_file": args.token_file}


def _verify_local(
    args: argparse.Namespace, problem: str, candidate: str, options: dict[str, Any]
) -> VerifyResult:
    from sandbox.api import verify

    return verify(
        problem,
        candidate,
        device=args.device,
        allow_weak_isolation=args.allow_weak_isolation,
        **options,
    )


def _fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g} ms"


def _fmt_x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _print_report(result: VerifyResult) -> None:
    """A short human-readable account of one verdict."""
    from rich.console import Console

    result = result.for_terminal()  # the candidate's text, its terminal escapes shown inert
    console = Console(highlight=False, soft_wrap=True)
    style = "green" if result.correct else ("yellow" if result.infrastructure_failure else "red")
    console.print(f"verdict: [bold {style}]{result.verdict.upper()}[/]")
    if result.message:
        console.print(f"message: {result.message}", markup=False)
    if result.trials:
        passed = sum(t.passed for t in result.trials)
        worst_abs = max(t.max_abs_error for t in result.trials)
        worst_rel = max(t.max_rel_error for t in result.trials)
        console.print(
            f"trials: {passed}/{len(result.trials)} passed, "
            f"max abs error {worst_abs:.3g}, max rel error {worst_rel:.3g}"
        )
        for t in result.trials:
            if not t.passed:
                console.print(
                    f"  trial {t.index}: {t.mismatch_fraction:.2%} mismatched; {t.message}",
                    markup=False,
                )
    if result.candidate_ms is not None:
        spread = (
            f" (spread {result.candidate_spread:.1%})"
            if result.candidate_spread is not None
            else ""
        )
        console.print(
            f"timing: candidate {_fmt_ms(result.candidate_ms)}{spread}, "
            f"eager {_fmt_ms(result.eager_ms)} ({_fmt_x(result.speedup_vs_eager)}), "
            f"torch.compile {_fmt_ms(result.compile_ms)} ({_fmt_x(result.speedup_vs_compile)}), "
            f"{result.timing_runs} runs" + (", re-timed" if result.retimed else "")
        )
    elif result.timing_unavailable_reason:
        console.print(f"timing: unavailable ({result.timing_unavailable_reason})", markup=False)
    details = [f"kernel launches: {result.kernel_launches}", f"elapsed: {result.elapsed_s:.2f} s"]
    if result.problem_degenerate:
        details.append("PROBLEM IS DEGENERATE")
    console.print(", ".join(details))
    prov = result.provenance
    if prov:
        where = ", ".join(
            f"{label} {prov[key]}"
            for key, label in (
                ("device", "device"),
                ("driver", "driver"),
                ("torch_version", "torch"),
                ("triton_version", "triton"),
                ("hostname", "host"),
            )
            if prov.get(key)
        )
        if where:
            console.print(f"judged on: {where}", markup=False)
    if result.candidate_log and not result.correct:
        console.print("candidate output (tail):", style="dim")
        console.print(result.candidate_log[-2000:], markup=False, style="dim")


# -- serve and info -----------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    from sandbox.config import DEFAULT_MAX_REQUEST_SOURCE_BYTES, SandboxConfig, ServerConfig
    from sandbox.server import run_server

    overrides: dict[str, Any] = {
        "device": args.device,
        "allow_weak_isolation": args.allow_weak_isolation,
    }
    if args.workers is not None:
        if args.workers < 1:
            return _fail("--workers must be at least 1")
        overrides["workers"] = args.workers
    if args.spares is not None:
        if args.spares < 1:
            return _fail("--spares must be at least 1")
        overrides["spares"] = args.spares
    if args.queue is not None:
        if args.queue < 0:
            return _fail("--queue must be at least 0")
        overrides["queue_capacity"] = args.queue
    if args.job_timeout is not None:
        overrides["job_timeout_s"] = args.job_timeout
    if args.gpus is not None:
        try:
            overrides["gpus"] = tuple(int(i) for i in args.gpus.split(","))
        except ValueError:
            return _fail(f"--gpus takes GPU indices like 0,1; not {args.gpus!r}")
        if args.device == "cpu":
            return _fail("--gpus needs a GPU sandbox, not --device cpu")
    if not 0 <= args.port <= 65535:
        return _fail("--port must be between 0 and 65535")
    if args.max_in_flight_per_client < 0:
        return _fail("--max-in-flight-per-client must be at least 0")
    if args.max_source_bytes is not None and args.max_source_bytes < 1:
        return _fail("--max-source-bytes must be at least 1")
    server_config = ServerConfig(
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        token_file=args.token_file,
        token_env=args.token_env,
        insecure=args.insecure,
        max_in_flight_per_client=args.max_in_flight_per_client,
        max_source_bytes=args.max_source_bytes or DEFAULT_MAX_REQUEST_SOURCE_BYTES,
        audit_log=args.audit_log,
    )
    return run_server(
        SandboxConfig(**overrides),
        args.host,
        args.port,
        server_config=server_config,
        log_level=args.log_level,
    )


def _info(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from sandbox.client import SandboxClient

    try:
        with SandboxClient(
            args.server, timeout_s=args.timeout, max_retries=1, **_client_access(args)
        ) as client:
            info = client.info(timeout_s=args.timeout)
    except Exception as err:  # noqa: BLE001 - one line, never a traceback
        return _fail(f"cannot reach {args.server}: {_describe(err)}")
    if args.json:
        _print_json(
            MessageToDict(
                info, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            )
        )
        return 0
    prov = info.provenance
    lines = [
        f"server: {args.server} ({'serving' if info.serving else 'NOT serving'})",
        f"mode: {info.mode}, device: {prov.device}"
        + (f", driver {prov.driver}" if prov.driver else "")
        + (", Triton interpreter" if prov.interpreter else ""),
        f"versions: sandbox {prov.sandbox_version}, torch {prov.torch_version}, "
        f"triton {prov.triton_version}, python {prov.python_version}",
        f"host: {prov.hostname}",
        f"workers: {info.busy_workers}/{info.workers} busy; "
        f"queue: {info.queue_depth}/{info.queue_capacity}; jobs done: {info.jobs_done}",
        "isolation:" + ("" if not info.weak_isolation_accepted else " (weaker isolation accepted)"),
    ]
    lines += [
        f"  {'ok     ' if f.available else 'MISSING'} {f.name}"
        + (f": {f.detail}" if f.detail else "")
        for f in info.isolation
    ]
    print("\n".join(lines))
    return 0
