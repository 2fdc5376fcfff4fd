"""What a candidate's source may contain: the static gate's allowlists, as data.

Everything not listed here is refused. Paths are canonical dotted names (`import torch.nn
as nn` makes `nn.Linear` the path `torch.nn.Linear`); a path's allowed leaf may be
followed by value attributes (`torch.float32.itemsize`), which are checked against the
value lists below. Host code is everything outside `@triton.jit` functions.
"""

from __future__ import annotations

import builtins
import math
import types

import torch
import triton.language as tl
from triton.language.extra import libdevice

# -- modules ---------------------------------------------------------------------------------

# What a candidate may import (at module level only): the kernel language, PyTorch for
# allocation and ModelNew set-up, math for host arithmetic. Nothing that reaches the
# process, the file system, other threads or raw memory.
IMPORTS = frozenset(
    {
        "torch",
        "torch.nn",
        "torch.nn.functional",  # KernelBench files import it; every F.* call is still refused
        "torch.nn.init",  # for ModelNew.__init__'s parameter set-up
        "triton",
        "triton.language",
        "triton.language.math",
        "triton.language.extra.libdevice",
        "triton.language.extra.cuda.libdevice",
        "math",
        "typing",  # only the names in TYPING_NAMES
    }
)
# `from typing import ...`: annotations only (not get_type_hints, which evaluates strings).
TYPING_NAMES = frozenset({"Any", "Dict", "List", "Optional", "Sequence", "Tuple", "Union"})
# `from __future__ import ...`: postponed annotations only.
FUTURE_NAMES = frozenset({"annotations"})

# -- host code: torch, triton and math paths -------------------------------------------------

# Allocation and random set-up: they fill memory with a constant or noise, never with the
# answer. Tensor-from-data (`torch.tensor`) is for ModelNew.__init__ only (INIT_PATHS).
_TORCH_ALLOCATION = (
    "empty empty_like empty_strided zeros zeros_like ones ones_like full full_like arange "
    "randn randn_like rand rand_like randint"
)
# Dtypes, devices, memory formats and type objects: names, not compute.
_TORCH_TYPES = (
    "float32 float float16 half bfloat16 float64 double int8 int16 int32 int int64 long uint8 "
    "bool float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz "
    "Tensor Size dtype device finfo iinfo strided "
    "contiguous_format channels_last channels_last_3d preserve_format"
)
# Shape arithmetic and view functions (views share memory; reshape may copy, which the
# runtime poisoning judges).
_TORCH_SHAPES = (
    "is_tensor is_floating_point numel broadcast_shapes get_default_dtype "
    "reshape flatten unsqueeze squeeze permute transpose t narrow split chunk unbind movedim "
    "broadcast_to"
)
# Device queries and the context managers honest launch code uses.
_TORCH_DEVICE = (
    "no_grad inference_mode version.cuda version.hip "
    "cuda.current_device cuda.is_available cuda.device_count cuda.get_device_capability "
    "cuda.get_device_properties cuda.get_device_name cuda.synchronize cuda.device"
)
# Triton's host helpers (the decorators are DECORATORS: `triton.jit(fn)` in host code
# would build a kernel out of host code) and the one driver query Triton's tutorials use.
_TRITON_HOST = (
    "triton.cdiv triton.next_power_of_2 triton.Config "
    "triton.runtime.driver.active.get_active_torch_device"
)
# Kernel-language names host code passes to kernels: constexpr and dtypes.
_TL_HOST = (
    "constexpr float16 bfloat16 float32 float64 int1 int8 int16 int32 int64 "
    "uint8 uint16 uint32 uint64 float8e4nv float8e5 float8e4b15"
)


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


def _paths(prefix: str, names: str) -> frozenset[str]:
    return frozenset(f"{prefix}{name}" for name in names.split())


# math holds only numeric functions and constants (no modules, nothing that reaches out).
MATH_PATHS = frozenset(f"math.{name}" for name in dir(math) if not name.startswith("_"))

HOST_PATHS = (
    _paths("torch.", f"{_TORCH_ALLOCATION} {_TORCH_TYPES} {_TORCH_SHAPES} {_TORCH_DEVICE}")
    | _paths("", _TRITON_HOST)
    | _paths("triton.language.", _TL_HOST)
    | MATH_PATHS
    | _paths("typing.", " ".join(TYPING_NAMES))
    | {"torch.nn.Module"}  # as ModelNew's base (and in isinstance checks)
)

# nn layer classes: ModelNew.__init__ may build them for their parameters (the grader seeds
# both models alike); calling one is PyTorch compute and is refused (`self.linear(x)`).
NN_LAYERS = frozenset(
    name
    for name in dir(torch.nn)
    if isinstance(getattr(torch.nn, name), type)
    and issubclass(getattr(torch.nn, name), torch.nn.Module)
)
# nn.init's initialisers (its module also holds `torch`, `math` and `warnings`: listed, not
# computed), and the fan helper nn.Linear's own reset_parameters uses.
_NN_INIT = (
    "calculate_gain constant_ dirac_ eye_ kaiming_normal_ kaiming_uniform_ normal_ ones_ "
    "orthogonal_ sparse_ trunc_normal_ uniform_ xavier_normal_ xavier_uniform_ zeros_ "
    "_calculate_fan_in_and_fan_out _calculate_correct_fan"
)
# ModelNew.__init__: parameter set-up before any scored call may use PyTorch (DESIGN §4).
INIT_PATHS = (
    _paths("torch.nn.", " ".join(NN_LAYERS))
    | _paths("torch.nn.", "Parameter Buffer")
    | _paths("torch.nn.init.", _NN_INIT)
    | _paths("torch.", "tensor linspace eye manual_seed")
)
# The only `_`-prefixed attributes a candidate may name (all in INIT_PATHS).
PRIVATE_PATH_EXCEPTIONS = frozenset(
    {"torch.nn.init._calculate_fan_in_and_fan_out", "torch.nn.init._calculate_correct_fan"}
)

# Calls allowed at import time (module level, decorator arguments, default values): pure
# constructors and arithmetic; no allocation, no launch, nothing with a side effect.
MODULE_CALLS = (
    MATH_PATHS
    | _paths("", "triton.cdiv triton.next_power_of_2 triton.Config")
    | _paths("", "triton.runtime.driver.active.get_active_torch_device")
    | _paths("torch.", "device cuda.is_available cuda.get_device_capability")
    | {"triton.language.constexpr"}
)

# `with` in host code: only these context managers (no streams, no autocast).
CONTEXT_MANAGERS = frozenset({"torch.no_grad", "torch.inference_mode", "torch.cuda.device"})

# Decorators. A function with a Triton decorator is a kernel; host functions and ModelNew
# methods may only turn gradients off.
KERNEL_DECORATORS = frozenset({"triton.jit", "triton.autotune", "triton.heuristics"})
HOST_DECORATORS = frozenset({"torch.no_grad", "torch.inference_mode"})
# `triton.jit(...)` keyword arguments: no `repr` or `launch_metadata` hooks.
JIT_KEYWORDS = frozenset(
    {"do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline"}
)

# -- host code: builtins and value attributes ------------------------------------------------

# Builtins host code may name: arithmetic, containers, iteration, errors. Refused among
# others: getattr/setattr/delattr/hasattr, vars, dir, globals, locals, eval, exec,
# compile, __import__, open, type, object, memoryview, id, iter, map, format, input,
# breakpoint, help, classmethod/staticmethod/property (and `super` outside
# `super().__init__()` in ModelNew.__init__).
HOST_BUILTINS = frozenset(
    {
        "abs", "all", "any", "bool", "dict", "divmod", "enumerate", "float", "int", "isinstance",
        "len", "list", "max", "min", "pow", "print", "range", "reversed", "round", "set",
        "slice", "sorted", "str", "sum", "tuple", "zip",
        "ArithmeticError", "AssertionError", "Exception", "IndexError", "KeyError",
        "NotImplementedError", "OverflowError", "RuntimeError", "TypeError", "ValueError",
        "ZeroDivisionError", "NotImplemented", "Ellipsis",
    }
)  # fmt: skip
# Builtins that only read a container passed to them (a module-level one may be passed).
READING_BUILTINS = frozenset(
    {"len", "sorted", "tuple", "list", "enumerate", "zip", "min", "max", "sum", "any", "all"}
)
# Every builtin name, to tell "refused builtin" from "the candidate's own name".
BUILTIN_NAMES = frozenset(dir(builtins))

# Methods host code may call on any value: tensor metadata and views, allocation like an
# existing tensor, dtype conversion (a real conversion is compute, which the runtime
# poisoning judges), filling with a constant, and Python list/dict/str helpers.
# Refused: every compute method (.sum, .exp, .matmul, ...), .item, .tolist, .numpy,
# .cpu, .clone, .copy_, .storage, .untyped_storage, .map_, .register_hook, .format, and
# .data_ptr (an address to key a cache on; Triton reads it itself).
VALUE_METHODS = _words(
    "size stride dim numel nelement element_size is_contiguous is_floating_point "
    "storage_offset get_device "
    "view view_as reshape reshape_as contiguous permute transpose t expand expand_as "
    "broadcast_to unsqueeze squeeze flatten unflatten narrow select split chunk unbind "
    "movedim detach "
    "new_empty new_zeros new_ones new_full zero_ fill_ "
    "to cuda float half bfloat16 double int long "
    "append extend insert pop items keys get count "
    "startswith endswith lower upper join"
)
# Attributes host code may read on any value (besides VALUE_METHODS): tensor, dtype, device
# and device-property metadata, and the parameters and settings of nn layers.
VALUE_ATTRIBUTES = _words(
    "shape dtype device ndim layout is_cuda requires_grad itemsize nbytes T mT data "
    "type index is_signed is_complex min max eps tiny bits "
    "multi_processor_count major minor name total_memory "
    "weight bias in_features out_features in_channels out_channels kernel_size stride "
    "padding dilation groups output_padding padding_mode eps momentum affine "
    "track_running_stats running_mean running_var normalized_shape elementwise_affine "
    "num_groups num_channels num_features negative_slope alpha beta lambd threshold "
    "min_val max_val inplace p dim num_embeddings embedding_dim padding_idx "
    "upscale_factor scale_factor mode align_corners approximate ceil_mode "
    "count_include_pad divisor_override return_indices output_size start_dim end_dim "
    "training"
)
# ModelNew.__init__ may also initialise parameters in place and move them.
INIT_VALUE_METHODS = _words(
    "uniform_ normal_ zero_ fill_ copy_ clone detach t mul_ div_ add_ sub_ clamp_ "
    "requires_grad_ contiguous cuda"
)
# Methods that change what they are called on: refused on module-level containers and,
# outside ModelNew's set-up, on ModelNew's attributes (no state across calls).
MUTATING_METHODS = frozenset({"append", "extend", "insert", "pop", "zero_", "fill_"})

# -- ModelNew --------------------------------------------------------------------------------

# nn.Module's own machinery (methods such as `to`, `apply`, `register_forward_hook`,
# `__call__`, and the `_parameters`-style internals): ModelNew may neither name nor
# override them, except these.
NN_MODULE_ATTRIBUTES = frozenset(dir(torch.nn.Module)) | frozenset(vars(torch.nn.Module()))
SELF_ATTRIBUTES = frozenset({"training"})
SELF_INIT_CALLS = frozenset({"register_buffer", "register_parameter"})
# Helper methods may not take Tensor names either: Triton calls `data_ptr()` (and reads
# `dtype`) on what it launches with, inside the launch.
TENSOR_ATTRIBUTES = frozenset(dir(torch.Tensor))

# -- @triton.jit bodies ----------------------------------------------------------------------


def _public_functions(module: types.ModuleType, names: list[str] | None = None) -> frozenset[str]:
    names = names if names is not None else [n for n in dir(module) if not n.startswith("_")]
    return frozenset(n for n in names if not isinstance(getattr(module, n, None), types.ModuleType))


# Triton's own language API (its `__all__`, modules left out), the math and libdevice
# namespaces, and the host helpers Triton also accepts in kernels.
KERNEL_PATHS = (
    frozenset(f"triton.language.{n}" for n in _public_functions(tl, list(tl.__all__)))
    | _paths(
        "triton.language.math.",
        "abs ceil cos div_rn erf exp exp2 fdiv floor fma log log2 rsqrt sin sqrt sqrt_rn umulhi",
    )
    | frozenset(f"triton.language.extra.libdevice.{n}" for n in _public_functions(libdevice))
    | frozenset(f"triton.language.extra.cuda.libdevice.{n}" for n in _public_functions(libdevice))
    | _paths("triton.", "cdiv next_power_of_2")
)
# Builtins Triton compiles in a kernel (its code generator's namespace; not getattr/hasattr).
KERNEL_BUILTINS = frozenset(
    {"range", "min", "max", "len", "float", "int", "print", "isinstance", "abs", "list"}
)
# Attributes of kernel values: tl.tensor's members, dtype and constexpr queries. Not
# `handle`, which under the CPU interpreter is the NumPy array behind a tensor.
KERNEL_VALUE_ATTRIBUTES = frozenset(n for n in dir(tl.tensor) if not n.startswith("_")) | _words(
    "dtype shape type numel value element_ty scalar primitive_bitwidth int_bitwidth "
    "fp_mantissa_width is_floating is_int is_int_signed is_int_unsigned is_ptr is_block "
    "is_bool is_fp8 is_fp16 is_bf16 is_fp32 is_fp64 is_standard_floating"
)

# Names of namespaces: they may start a path but are never values themselves.
NAMESPACES = frozenset(
    {
        "torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.cuda",
        "torch.version", "triton", "triton.language", "triton.language.math",
        "triton.language.extra", "triton.language.extra.libdevice",
        "triton.language.extra.cuda", "triton.language.extra.cuda.libdevice", "math",
        "typing", "triton.runtime", "triton.runtime.driver", "triton.runtime.driver.active",
    }
)  # fmt: skip

# -- timing: what could tell a timed call from another, or work outside the timed window ----

# Paths refused with a reason of their own (they are outside the allowlists anyway): the
# refusal names why. Prefixes: `torch.cuda.graphs.x` is refused as `torch.cuda.graphs` is.
REFUSED_REASONS = {
    "torch.cuda.graph": "CUDA graphs replay work that no check sees",
    "torch.cuda.graphs": "CUDA graphs replay work that no check sees",
    "torch.cuda.CUDAGraph": "CUDA graphs replay work that no check sees",
    "torch.cuda.make_graphed_callables": "CUDA graphs replay work that no check sees",
    "torch.cuda.graph_pool_handle": "CUDA graphs replay work that no check sees",
    "torch.cuda.Stream": "the timed window is one stream: no work beside it",
    "torch.cuda.stream": "the timed window is one stream: no work beside it",
    "torch.cuda.set_stream": "the timed window is one stream: no work beside it",
    "torch.cuda.ExternalStream": "the timed window is one stream: no work beside it",
    "torch.cuda.Event": "timing is the sandbox's",
    "triton.language.extra.cuda.globaltimer": "reading the GPU's clock tells timed calls apart",
    "triton.testing": "timing is the sandbox's",
}
# `tl.inline_asm_elementwise` is Triton's (allowed in kernels), but its assembly must be a
# string literal that reads none of the GPU's clocks: `%globaltimer` would tell back-to-back
# timed calls from trials a second apart.
INLINE_ASM = "triton.language.inline_asm_elementwise"
TIMER_REGISTERS = r"%\s*(?:globaltimer(?:_lo|_hi)?|clock(?:64|_hi)?)\b"
