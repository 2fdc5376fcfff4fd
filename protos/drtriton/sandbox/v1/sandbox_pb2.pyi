from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProblemFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FORMAT_AUTO: _ClassVar[ProblemFormat]
    FORMAT_FUNCTIONAL: _ClassVar[ProblemFormat]
    FORMAT_KERNELBENCH: _ClassVar[ProblemFormat]

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    CORRECT: _ClassVar[Verdict]
    SYNTAX_ERROR: _ClassVar[Verdict]
    NO_ENTRY_POINT: _ClassVar[Verdict]
    NO_TRITON_KERNEL: _ClassVar[Verdict]
    COMPILE_ERROR: _ClassVar[Verdict]
    RUNTIME_ERROR: _ClassVar[Verdict]
    TIMEOUT: _ClassVar[Verdict]
    RESOURCE_LIMIT: _ClassVar[Verdict]
    WRONG_OUTPUT: _ClassVar[Verdict]
    TORCH_FALLBACK: _ClassVar[Verdict]
    INPUT_MUTATION: _ClassVar[Verdict]
    TAMPERING: _ClassVar[Verdict]
    SANDBOX_ERROR: _ClassVar[Verdict]
    BAD_PROBLEM: _ClassVar[Verdict]
    DISALLOWED_CODE: _ClassVar[Verdict]

class Baseline(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BASELINE_UNSPECIFIED: _ClassVar[Baseline]
    EAGER: _ClassVar[Baseline]
    TORCH_COMPILE: _ClassVar[Baseline]
FORMAT_AUTO: ProblemFormat
FORMAT_FUNCTIONAL: ProblemFormat
FORMAT_KERNELBENCH: ProblemFormat
VERDICT_UNSPECIFIED: Verdict
CORRECT: Verdict
SYNTAX_ERROR: Verdict
NO_ENTRY_POINT: Verdict
NO_TRITON_KERNEL: Verdict
COMPILE_ERROR: Verdict
RUNTIME_ERROR: Verdict
TIMEOUT: Verdict
RESOURCE_LIMIT: Verdict
WRONG_OUTPUT: Verdict
TORCH_FALLBACK: Verdict
INPUT_MUTATION: Verdict
TAMPERING: Verdict
SANDBOX_ERROR: Verdict
BAD_PROBLEM: Verdict
DISALLOWED_CODE: Verdict
BASELINE_UNSPECIFIED: Baseline
EAGER: Baseline
TORCH_COMPILE: Baseline

class VerifyOptions(_message.Message):
    __slots__ = ("trials", "atol", "rtol", "timing", "baselines", "time_budget_s", "seed")
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    ATOL_FIELD_NUMBER: _ClassVar[int]
    RTOL_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    BASELINES_FIELD_NUMBER: _ClassVar[int]
    TIME_BUDGET_S_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    trials: int
    atol: float
    rtol: float
    timing: bool
    baselines: _containers.RepeatedScalarFieldContainer[Baseline]
    time_budget_s: float
    seed: int
    def __init__(self, trials: _Optional[int] = ..., atol: _Optional[float] = ..., rtol: _Optional[float] = ..., timing: bool = ..., baselines: _Optional[_Iterable[_Union[Baseline, str]]] = ..., time_budget_s: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("request_id", "problem", "candidate", "format", "options")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    problem: str
    candidate: str
    format: ProblemFormat
    options: VerifyOptions
    def __init__(self, request_id: _Optional[str] = ..., problem: _Optional[str] = ..., candidate: _Optional[str] = ..., format: _Optional[_Union[ProblemFormat, str]] = ..., options: _Optional[_Union[VerifyOptions, _Mapping]] = ...) -> None: ...

class TrialResult(_message.Message):
    __slots__ = ("index", "passed", "max_abs_error", "max_rel_error", "mismatch_fraction", "message")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    MAX_ABS_ERROR_FIELD_NUMBER: _ClassVar[int]
    MAX_REL_ERROR_FIELD_NUMBER: _ClassVar[int]
    MISMATCH_FRACTION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    index: int
    passed: bool
    max_abs_error: float
    max_rel_error: float
    mismatch_fraction: float
    message: str
    def __init__(self, index: _Optional[int] = ..., passed: bool = ..., max_abs_error: _Optional[float] = ..., max_rel_error: _Optional[float] = ..., mismatch_fraction: _Optional[float] = ..., message: _Optional[str] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("candidate_ms", "candidate_spread", "eager_ms", "compile_ms", "speedup_vs_eager", "speedup_vs_compile", "runs", "retimed", "unavailable_reason")
    CANDIDATE_MS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_SPREAD_FIELD_NUMBER: _ClassVar[int]
    EAGER_MS_FIELD_NUMBER: _ClassVar[int]
    COMPILE_MS_FIELD_NUMBER: _ClassVar[int]
    SPEEDUP_VS_EAGER_FIELD_NUMBER: _ClassVar[int]
    SPEEDUP_VS_COMPILE_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    RETIMED_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    candidate_ms: float
    candidate_spread: float
    eager_ms: float
    compile_ms: float
    speedup_vs_eager: float
    speedup_vs_compile: float
    runs: int
    retimed: bool
    unavailable_reason: str
    def __init__(self, candidate_ms: _Optional[float] = ..., candidate_spread: _Optional[float] = ..., eager_ms: _Optional[float] = ..., compile_ms: _Optional[float] = ..., speedup_vs_eager: _Optional[float] = ..., speedup_vs_compile: _Optional[float] = ..., runs: _Optional[int] = ..., retimed: bool = ..., unavailable_reason: _Optional[str] = ...) -> None: ...

class Provenance(_message.Message):
    __slots__ = ("device", "driver", "torch_version", "triton_version", "python_version", "sandbox_version", "hostname", "interpreter")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    TORCH_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRITON_VERSION_FIELD_NUMBER: _ClassVar[int]
    PYTHON_VERSION_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_VERSION_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    INTERPRETER_FIELD_NUMBER: _ClassVar[int]
    device: str
    driver: str
    torch_version: str
    triton_version: str
    python_version: str
    sandbox_version: str
    hostname: str
    interpreter: bool
    def __init__(self, device: _Optional[str] = ..., driver: _Optional[str] = ..., torch_version: _Optional[str] = ..., triton_version: _Optional[str] = ..., python_version: _Optional[str] = ..., sandbox_version: _Optional[str] = ..., hostname: _Optional[str] = ..., interpreter: bool = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("request_id", "verdict", "message", "trials", "timing", "kernel_launches", "problem_degenerate", "provenance", "elapsed_s", "candidate_log", "stage_seconds", "gpu_memory_gib")
    class StageSecondsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class GpuMemoryGibEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    KERNEL_LAUNCHES_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_DEGENERATE_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_LOG_FIELD_NUMBER: _ClassVar[int]
    STAGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_GIB_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    verdict: Verdict
    message: str
    trials: _containers.RepeatedCompositeFieldContainer[TrialResult]
    timing: Timing
    kernel_launches: int
    problem_degenerate: bool
    provenance: Provenance
    elapsed_s: float
    candidate_log: str
    stage_seconds: _containers.ScalarMap[str, float]
    gpu_memory_gib: _containers.ScalarMap[str, float]
    def __init__(self, request_id: _Optional[str] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., message: _Optional[str] = ..., trials: _Optional[_Iterable[_Union[TrialResult, _Mapping]]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., kernel_launches: _Optional[int] = ..., problem_degenerate: bool = ..., provenance: _Optional[_Union[Provenance, _Mapping]] = ..., elapsed_s: _Optional[float] = ..., candidate_log: _Optional[str] = ..., stage_seconds: _Optional[_Mapping[str, float]] = ..., gpu_memory_gib: _Optional[_Mapping[str, float]] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IsolationFeature(_message.Message):
    __slots__ = ("name", "available", "detail")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    name: str
    available: bool
    detail: str
    def __init__(self, name: _Optional[str] = ..., available: bool = ..., detail: _Optional[str] = ...) -> None: ...

class GetInfoResponse(_message.Message):
    __slots__ = ("provenance", "mode", "workers", "busy_workers", "queue_depth", "queue_capacity", "isolation", "weak_isolation_accepted", "serving", "jobs_done")
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    BUSY_WORKERS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    WEAK_ISOLATION_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    JOBS_DONE_FIELD_NUMBER: _ClassVar[int]
    provenance: Provenance
    mode: str
    workers: int
    busy_workers: int
    queue_depth: int
    queue_capacity: int
    isolation: _containers.RepeatedCompositeFieldContainer[IsolationFeature]
    weak_isolation_accepted: bool
    serving: bool
    jobs_done: int
    def __init__(self, provenance: _Optional[_Union[Provenance, _Mapping]] = ..., mode: _Optional[str] = ..., workers: _Optional[int] = ..., busy_workers: _Optional[int] = ..., queue_depth: _Optional[int] = ..., queue_capacity: _Optional[int] = ..., isolation: _Optional[_Iterable[_Union[IsolationFeature, _Mapping]]] = ..., weak_isolation_accepted: bool = ..., serving: bool = ..., jobs_done: _Optional[int] = ...) -> None: ...
