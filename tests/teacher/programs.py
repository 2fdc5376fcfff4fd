"""Small functional-format programs for the teacher's tests.

`LEVEL1` holds hand-picked one-operator programs for every operator (at least three
each, covering keepdim both ways, every dim, broadcasting ranks and the pooling /
convolution parameters); `random_program` draws multi-operator programs with a
simple shape-aware builder. The synth generator replaces the builder when present.
"""

from __future__ import annotations

import random
import re

HEADER = "import torch\nimport torch.nn.functional as F\n"


def render(inputs: list[list[int]], calls: list[str]) -> str:
    """A program with `inputs` shapes and one `tensor_N = call` line per call.

    Calls refer to tensors as `{0}`, `{1}`, ... (tensor numbers); the outputs are the
    computed tensors no later call reads, as the generator prints them.
    """
    names = [f"tensor_{i}" for i in range(len(inputs) + len(calls))]
    lines = [HEADER, "def get_inputs():"]
    for i, shape in enumerate(inputs):
        lines.append(f"    {names[i]} = torch.randn({list(shape)}, dtype=torch.float32)")
    lines.append(f"    return [{', '.join(names[: len(inputs)])}]\n")
    lines.append(f"def fused_operator({', '.join(names[: len(inputs)])}):")
    body = [call.format(*names) for call in calls]
    for i, call in enumerate(body):
        lines.append(f"    {names[len(inputs) + i]} = {call}")
    consumed = {name for call in body for name in names if re.search(rf"\b{name}\b", call)}
    outputs = [
        names[len(inputs) + i] for i in range(len(calls)) if names[len(inputs) + i] not in consumed
    ]
    lines.append(f"    return [{', '.join(outputs)}]")
    return "\n".join(lines) + "\n"


def one(inputs: list[list[int]], call: str) -> str:
    return render(inputs, [call])


def _unary(call: str) -> list[str]:
    shapes = [[4, 8], [2, 3, 5, 7], [], [2, 1, 3, 2, 5]]
    return [one([s], call) for s in shapes]


def _binary(fn: str) -> list[str]:
    pairs = [
        ([4, 8], [4, 8]),
        ([2, 1, 5], [3, 5]),
        ([], [3, 4]),
        ([2, 1, 3, 1, 4], [1, 3, 1, 5, 1]),
        ([6, 1], [1, 7]),
    ]
    return [one([a, b], f"{fn}({{0}}, {{1}})") for a, b in pairs]


def _reduce(call: str) -> list[str]:
    cases = [
        ([4, 8], 0, False),
        ([4, 8], 1, True),
        ([2, 3, 4, 5], 1, False),
        ([2, 3, 4, 5], 3, True),
        ([16], 0, False),
        ([2, 3, 2, 3, 4], 4, False),
        ([3, 2, 2, 5, 2], 0, True),
        ([2, 1500], 1, False),
        ([300, 16], 0, True),
    ]
    suffix = {"max": ".values", "min": ".values", "argmax": ".float()", "argmin": ".float()"}
    name = call.split(".")[-1]
    return [
        one([shape], f"{call}({{0}}, dim={dim}, keepdim={keepdim}){suffix.get(name, '')}")
        for shape, dim, keepdim in cases
    ]


def _along(call: str, suffix: str = "") -> list[str]:
    # The last two sweep the dim in several steps (row and column layouts).
    cases = [
        ([4, 8], 1),
        ([4, 8], 0),
        ([2, 3, 5], 1),
        ([2, 3, 2, 2, 3], 3),
        ([2, 1100], 1),
        ([600, 3], 0),
    ]
    return [one([shape], f"{call}({{0}}, dim={dim}){suffix}") for shape, dim in cases]


def _bn(shape: list[int]) -> str:
    c = shape[1]
    return one(
        [shape],
        f"F.batch_norm({{0}}, torch.zeros({c}, device={{0}}.device), "
        f"torch.ones({c}, device={{0}}.device), training=True)",
    )


LEVEL1: dict[str, list[str]] = {
    **{
        name: _binary(f"torch.{name}")
        for name in ("add", "sub", "mul", "div", "maximum", "minimum")
    },
    "lerp": [
        one([[4, 8], [4, 8], [4, 8]], "torch.lerp({0}, {1}, {2})"),
        one([[2, 1, 5], [3, 5], [5]], "torch.lerp({0}, {1}, {2})"),
        one([[3, 4], [2, 1, 4], [2, 3, 1]], "torch.lerp({0}, {1}, {2})"),
    ],
    "matmul": [
        one([[8, 16], [16, 12]], "torch.matmul({0}, {1})"),
        one([[2, 3, 8, 5], [5, 7]], "torch.matmul({0}, {1})"),
        one([[3, 1, 4, 40], [2, 40, 5]], "torch.matmul({0}, {1})"),
        one([[20, 33], [2, 2, 2, 33, 17]], "torch.matmul({0}, {1})"),
    ],
    "bmm": [
        one([[2, 8, 16], [2, 16, 4]], "torch.bmm({0}, {1})"),
        one([[3, 17, 33], [3, 33, 9]], "torch.bmm({0}, {1})"),
        one([[1, 5, 5], [1, 5, 5]], "torch.bmm({0}, {1})"),
    ],
    **{
        name: _reduce(f"torch.{name}")
        for name in ("sum", "mean", "max", "min", "argmax", "argmin", "var", "norm")
    },
    "transpose": [
        one([s], "torch.transpose({0}, -2, -1)") for s in ([4, 8], [2, 3, 5], [2, 1, 3, 4, 5])
    ],
    "cat": [
        one([[4, 3], [2, 3]], "torch.cat([{0}, {1}], dim=0)"),
        one([[2, 3, 4], [2, 5, 4]], "torch.cat([{0}, {1}], dim=1)"),
        one([[2, 3], [2, 4]], "torch.cat([{0}, {1}], dim=1)"),
        one([[2, 1, 2, 3, 2], [2, 1, 2, 3, 5]], "torch.cat([{0}, {1}], dim=4)"),
        one([[5], [3]], "torch.cat([{0}, {1}], dim=0)"),
    ],
    "stack": [
        one([[3, 4], [3, 4]], "torch.stack([{0}, {1}], dim=0)"),
        one([[3, 4], [3, 4]], "torch.stack([{0}, {1}], dim=1)"),
        one([[3, 4], [3, 4]], "torch.stack([{0}, {1}], dim=2)"),
        one([[5], [5]], "torch.stack([{0}, {1}], dim=1)"),
        one([[2, 1, 3, 2], [2, 1, 3, 2]], "torch.stack([{0}, {1}], dim=3)"),
    ],
    "triu": [one([s], "torch.triu({0})") for s in ([5, 7], [2, 6, 4], [2, 2, 3, 3, 3])],
    "tril": [one([s], "torch.tril({0})") for s in ([5, 7], [2, 6, 4], [2, 2, 3, 3, 3])],
    "relu": _unary("torch.relu({0})"),
    "leaky_relu": _unary("F.leaky_relu({0}, negative_slope=0.01)"),
    "sigmoid": _unary("torch.sigmoid({0})"),
    "tanh": _unary("torch.tanh({0})"),
    "softmax": _along("torch.softmax"),
    "log_softmax": _along("torch.log_softmax"),
    "silu": _unary("F.silu({0})"),
    "gelu": _unary("F.gelu({0})"),
    "selu": _unary("torch.selu({0})"),
    "hardsigmoid": _unary("F.hardsigmoid({0})"),
    "softplus": _unary("F.softplus({0})"),
    "softsign": _unary("F.softsign({0})"),
    "elu": _unary("F.elu({0}, alpha=1.0)"),
    "hardtanh": _unary("F.hardtanh({0}, min_val=-1.0, max_val=1.0)"),
    "clamp": _unary("torch.clamp({0}, min=0.0, max=1.0)"),
    "logsigmoid": _unary("F.logsigmoid({0})"),
    "cos": _unary("torch.cos({0})"),
    "sin": _unary("torch.sin({0})"),
    "exp2": _unary("torch.exp2({0})"),
    "abs": _unary("torch.abs({0})"),
    "cumsum": _along("torch.cumsum"),
    "cummax": _along("torch.cummax", ".values"),
    "cummin": _along("torch.cummin", ".values"),
    # Groups longer than a block, too few to fill a GPU, are split across programs (the
    # last case of each: a moments kernel, then the normalising one merges the segments).
    # batch_norm tiles channels side by side where their runs are short: [N, C] inputs,
    # more channels than one tile holds, split or not.
    "batch_norm": [
        _bn(s)
        for s in (
            [8, 4],
            [2, 3, 5],
            [4, 3, 20, 20],
            [2, 2, 3, 3, 3],
            [40, 6, 3],
            [700, 70],
            [3000, 5],
            [7, 2, 9, 50],
        )  # fmt: skip
    ],
    "layer_norm": [
        one([[4, 8, 6]], "F.layer_norm({0}, normalized_shape=[8, 6])"),
        one([[2, 3, 4, 5]], "F.layer_norm({0}, normalized_shape=[3, 4, 5])"),
        one([[2, 2, 2, 3, 4]], "F.layer_norm({0}, normalized_shape=[2, 2, 3, 4])"),
        one([[2, 40, 40]], "F.layer_norm({0}, normalized_shape=[40, 40])"),
        one([[3, 61, 70]], "F.layer_norm({0}, normalized_shape=[3, 61, 70])"),
    ],
    "group_norm": [
        one([[2, 6, 5]], "F.group_norm({0}, num_groups=3)"),
        one([[2, 4, 3, 3]], "F.group_norm({0}, num_groups=2)"),
        one([[3, 4]], "F.group_norm({0}, num_groups=2)"),
        one([[2, 4, 2, 2, 2]], "F.group_norm({0}, num_groups=4)"),
        one([[1, 4, 45, 50]], "F.group_norm({0}, num_groups=2)"),
    ],
    "instance_norm": [
        one([[2, 3, 8]], "F.instance_norm({0})"),
        one([[2, 3, 4, 5]], "F.instance_norm({0})"),
        one([[1, 2, 3, 3, 3]], "F.instance_norm({0})"),
    ],
    "avg_pool1d": [
        one([[2, 3, 16]], "F.avg_pool1d({0}, kernel_size=3, stride=2, padding=1)"),
        one([[2, 3, 15]], "F.avg_pool1d({0}, kernel_size=4, stride=1, padding=0)"),
        one([[3, 16]], "F.avg_pool1d({0}, kernel_size=5, stride=3, padding=2)"),
    ],
    "avg_pool2d": [
        one([[2, 3, 9, 9]], "F.avg_pool2d({0}, kernel_size=3, stride=2, padding=1)"),
        one([[1, 2, 8, 7]], "F.avg_pool2d({0}, kernel_size=2, stride=2, padding=0)"),
        one([[2, 7, 6]], "F.avg_pool2d({0}, kernel_size=4, stride=1, padding=2)"),
    ],
    "avg_pool3d": [
        one([[1, 2, 4, 4, 4]], "F.avg_pool3d({0}, kernel_size=3, stride=1, padding=1)"),
        one([[2, 1, 5, 7, 6]], "F.avg_pool3d({0}, kernel_size=2, stride=2, padding=0)"),
        one([[1, 2, 7, 5, 5]], "F.avg_pool3d({0}, kernel_size=3, stride=2, padding=1)"),
    ],
    "max_pool1d": [
        one([[2, 3, 16]], "F.max_pool1d({0}, kernel_size=3, stride=2, padding=1, dilation=1)"),
        one([[2, 3, 17]], "F.max_pool1d({0}, kernel_size=3, stride=1, padding=1, dilation=2)"),
        one([[3, 20]], "F.max_pool1d({0}, kernel_size=4, stride=3, padding=0, dilation=3)"),
    ],
    "max_pool2d": [
        one([[2, 3, 9, 9]], "F.max_pool2d({0}, kernel_size=3, stride=2, padding=1, dilation=1)"),
        one([[1, 2, 10, 8]], "F.max_pool2d({0}, kernel_size=3, stride=1, padding=1, dilation=2)"),
        one([[2, 8, 7]], "F.max_pool2d({0}, kernel_size=2, stride=2, padding=0, dilation=1)"),
    ],
    "max_pool3d": [
        one([[1, 2, 4, 4, 4]], "F.max_pool3d({0}, kernel_size=3, stride=1, padding=1, dilation=1)"),
        one([[1, 1, 7, 8, 7]], "F.max_pool3d({0}, kernel_size=3, stride=2, padding=1, dilation=2)"),
        one([[2, 1, 4, 5, 6]], "F.max_pool3d({0}, kernel_size=2, stride=2, padding=0, dilation=1)"),
    ],
    "conv1d": [
        one(
            [[2, 4, 16], [6, 4, 3]], "F.conv1d({0}, {1}, stride=1, padding=1, dilation=1, groups=1)"
        ),
        one(
            [[2, 4, 16], [6, 2, 5]], "F.conv1d({0}, {1}, stride=2, padding=2, dilation=1, groups=2)"
        ),
        one([[4, 20], [6, 4, 3]], "F.conv1d({0}, {1}, stride=1, padding=0, dilation=3, groups=1)"),
        one(
            [[1, 6, 12], [6, 1, 4]], "F.conv1d({0}, {1}, stride=3, padding=1, dilation=2, groups=6)"
        ),
        # 16 x 24 channel pairs a group: tl.dot's tiles (the cases above sum their products)
        one(
            [[2, 16, 9], [24, 16, 3]],
            "F.conv1d({0}, {1}, stride=1, padding=1, dilation=1, groups=1)",
        ),
    ],
    "conv2d": [
        one(
            [[2, 4, 8, 8], [6, 2, 3, 3]],
            "F.conv2d({0}, {1}, stride=2, padding=1, dilation=1, groups=2)",
        ),
        one(
            [[1, 3, 7, 9], [4, 3, 3, 3]],
            "F.conv2d({0}, {1}, stride=1, padding=2, dilation=2, groups=1)",
        ),
        one(
            [[3, 6, 5], [5, 3, 4, 4]],
            "F.conv2d({0}, {1}, stride=1, padding=0, dilation=1, groups=1)",
        ),
        one(  # tl.dot's tiles: 16 x 32 channel pairs a group
            [[1, 32, 5, 6], [64, 16, 3, 3]],
            "F.conv2d({0}, {1}, stride=1, padding=1, dilation=1, groups=2)",
        ),
    ],
    "conv3d": [
        one(
            [[1, 2, 4, 4, 3], [4, 2, 3, 3, 3]],
            "F.conv3d({0}, {1}, stride=1, padding=1, dilation=1, groups=1)",
        ),
        one(
            [[1, 4, 3, 4, 3], [4, 2, 2, 3, 2]],
            "F.conv3d({0}, {1}, stride=2, padding=1, dilation=1, groups=2)",
        ),
        one(
            [[1, 1, 5, 6, 5], [2, 1, 3, 3, 3]],
            "F.conv3d({0}, {1}, stride=1, padding=0, dilation=2, groups=1)",
        ),
    ],
    "conv_transpose1d": [
        one(
            [[2, 4, 8], [4, 3, 3]],
            "F.conv_transpose1d({0}, {1}, stride=2, padding=1, output_padding=1, groups=1, dilation=1)",
        ),
        one(
            [[2, 4, 8], [4, 3, 3]],
            "F.conv_transpose1d({0}, {1}, stride=1, padding=0, output_padding=0, groups=2, dilation=1)",
        ),
        one(
            [[3, 10], [3, 2, 4]],
            "F.conv_transpose1d({0}, {1}, stride=3, padding=2, output_padding=1, groups=1, dilation=2)",
        ),
        one(  # tl.dot's tiles: 16 x 20 channel pairs a group
            [[2, 16, 5], [16, 20, 3]],
            "F.conv_transpose1d({0}, {1}, stride=2, padding=1, output_padding=1, groups=1, dilation=1)",
        ),
    ],
    "conv_transpose2d": [
        one(
            [[1, 4, 5, 5], [4, 2, 3, 3]],
            "F.conv_transpose2d({0}, {1}, stride=2, padding=1, output_padding=1, groups=2, dilation=1)",
        ),
        one(
            [[2, 3, 4, 6], [3, 2, 3, 3]],
            "F.conv_transpose2d({0}, {1}, stride=1, padding=1, output_padding=0, groups=1, dilation=2)",
        ),
        one(
            [[2, 5, 4], [2, 3, 4, 4]],
            "F.conv_transpose2d({0}, {1}, stride=2, padding=0, output_padding=0, groups=1, dilation=1)",
        ),
        one(  # tl.dot's tiles: 16 x 16 channel pairs a group
            [[1, 32, 3, 4], [32, 16, 3, 3]],
            "F.conv_transpose2d({0}, {1}, stride=2, padding=1, output_padding=1, groups=2, dilation=1)",
        ),
    ],
    "conv_transpose3d": [
        one(
            [[1, 2, 3, 3, 3], [2, 3, 3, 3, 3]],
            "F.conv_transpose3d({0}, {1}, stride=2, padding=1, output_padding=0, groups=1, dilation=1)",
        ),
        one(
            [[1, 4, 2, 2, 3], [4, 1, 2, 3, 2]],
            "F.conv_transpose3d({0}, {1}, stride=1, padding=1, output_padding=0, groups=4, dilation=1)",
        ),
        one(
            [[1, 1, 2, 2, 2], [1, 2, 2, 3, 2]],
            "F.conv_transpose3d({0}, {1}, stride=2, padding=0, output_padding=1, groups=1, dilation=2)",
        ),
    ],
}


# --------------------------------------------------------------------------- random programs

_UNARY = [
    "torch.relu({0})",
    "F.leaky_relu({0}, negative_slope=0.01)",
    "torch.sigmoid({0})",
    "torch.tanh({0})",
    "F.silu({0})",
    "F.gelu({0})",
    "torch.selu({0})",
    "F.hardsigmoid({0})",
    "F.softplus({0})",
    "F.softsign({0})",
    "F.elu({0}, alpha=1.0)",
    "F.hardtanh({0}, min_val=-1.0, max_val=1.0)",
    "torch.clamp({0}, min=0.0, max=1.0)",
    "F.logsigmoid({0})",
    "torch.cos({0})",
    "torch.sin({0})",
    "torch.abs({0})",
]
_BINARY = ["torch.add", "torch.sub", "torch.mul", "torch.maximum", "torch.minimum"]


class _Builder:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.inputs: list[list[int]] = []
        self.shapes: list[list[int]] = []  # by tensor number: inputs first, then computed
        self.calls: list[tuple[str, list[int]]] = []  # (call with {tensor refs}, shape)
        self.pool: list[int] = []  # unconsumed tensors

    def fresh(self, shape: list[int]) -> str:
        """A placeholder for a new input; tensor numbers are fixed in `source()`."""
        self.inputs.append(list(shape))
        return f"<in{len(self.inputs) - 1}>"

    def take(self) -> tuple[str, list[int]]:
        if self.pool and self.rng.random() < 0.85:
            index = self.rng.choice(self.pool)
            self.pool.remove(index)
            return f"<t{index}>", self.calls[index][1]
        shape = [self.rng.randint(2, 6) for _ in range(self.rng.randint(1, 4))]
        return self.fresh(shape), shape

    def push(self, call: str, shape: list[int]) -> None:
        self.calls.append((call, shape))
        self.pool.append(len(self.calls) - 1)

    def step(self) -> None:
        rng = self.rng
        x, shape = self.take()
        rank = len(shape)
        kind = rng.choice(
            [
                "unary",
                "unary",
                "binary",
                "binary",
                "reduce",
                "softmax",
                "scan",
                "matmul",
                "layout",
                "norm",
            ]
        )
        if kind == "binary":
            other = [d if rng.random() < 0.7 else 1 for d in shape][rng.randint(0, rank) :]
            y = self.fresh(other) if rng.random() < 0.5 or not self.pool else None
            if y is None:
                # another computed tensor of the same shape when one exists
                same = [i for i in self.pool if self.calls[i][1] == shape]
                if same:
                    self.pool.remove(same[0])
                    y = f"<t{same[0]}>"
                else:
                    y = self.fresh(other)
            self.push(f"{rng.choice(_BINARY)}({x}, {y})", shape)
        elif kind == "reduce" and rank >= 1 and max(shape) > 1:
            dim = rng.choice([d for d in range(rank) if shape[d] > 1])
            keepdim = rng.random() < 0.5
            name = rng.choice(["sum", "mean", "max", "min", "argmax", "var", "norm"])
            suffix = {"max": ".values", "min": ".values", "argmax": ".float()"}.get(name, "")
            out = shape[:dim] + ([1] if keepdim else []) + shape[dim + 1 :]
            self.push(f"torch.{name}({x}, dim={dim}, keepdim={keepdim}){suffix}", out)
        elif kind == "softmax" and rank >= 1:
            name = rng.choice(["torch.softmax", "torch.log_softmax"])
            self.push(f"{name}({x}, dim={rng.randrange(rank)})", shape)
        elif kind == "scan" and rank >= 1:
            name, suffix = rng.choice(
                [("cumsum", ""), ("cummax", ".values"), ("cummin", ".values")]
            )
            self.push(f"torch.{name}({x}, dim={rng.randrange(rank)}){suffix}", shape)
        elif kind == "matmul" and rank >= 2:
            n = rng.randint(2, 9)
            w = self.fresh([shape[-1], n])
            self.push(f"torch.matmul({x}, {w})", shape[:-1] + [n])
        elif kind == "layout" and rank >= 2:
            choice = rng.choice(["transpose", "triu", "cat"])
            if choice == "transpose":
                self.push(f"torch.transpose({x}, -2, -1)", shape[:-2] + [shape[-1], shape[-2]])
            elif choice == "triu":
                self.push(f"torch.tril({x})", shape)
            else:
                dim = rng.randrange(rank)
                other = list(shape)
                other[dim] = rng.randint(1, 4)
                y = self.fresh(other)
                out = list(shape)
                out[dim] += other[dim]
                self.push(f"torch.cat([{x}, {y}], dim={dim})", out)
        elif kind == "norm" and rank >= 3:
            dims = ", ".join(str(d) for d in shape[-2:])
            self.push(f"F.layer_norm({x}, normalized_shape=[{dims}])", shape)
        else:
            self.push(rng.choice(_UNARY).format(x), shape)

    def source(self) -> str:
        n_in = len(self.inputs)
        text_calls = []
        for call, _ in self.calls:
            for i in range(n_in):
                call = call.replace(f"<in{i}>", "{" + str(i) + "}")
            for i in range(len(self.calls)):
                call = call.replace(f"<t{i}>", "{" + str(n_in + i) + "}")
            text_calls.append(call)
        return render(self.inputs, text_calls)


# Cases that take several seconds under the interpreter: run with `-m slow` only.
SLOW_LEVEL1 = {("cummax", 4), ("cummax", 5), ("cummin", 4), ("cummin", 5)}


def random_program(level: int, seed: int) -> str:
    """A random program of `level` operators over small shapes (dims <= 9)."""
    builder = _Builder(random.Random(seed))
    for _ in range(level):
        builder.step()
    return builder.source()
