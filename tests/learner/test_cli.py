"""The `model`, `tokenizer` and `sample` commands: exit 0 on good input, 2 and one line on bad."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import drtriton_cli
from learner.model import io as model_io
from learner.model import safetensors_io as st

from .conftest import random_tiny_model

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """import torch
def get_inputs():
    tensor_0 = torch.randn([32, 64], dtype=torch.float32)
    return [tensor_0]

def fused_operator(tensor_0):
    tensor_1 = torch.relu(tensor_0)
    return [tensor_1]
"""
KERNEL = """<triton_code>
import triton
import triton.language as tl

@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=offs < n)
</triton_code>"""


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = drtriton_cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_usage_error(result: tuple[int, str, str], fragment: str) -> None:
    code, _, err = result
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("drtriton: error: ") and fragment in lines[0], (
        err
    )


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("cli")
    model_io.save_model(random_tiny_model(), base / "model")
    model_io.export_hf(base / "model", base / "hf")
    return base / "hf"


def test_import_export_score(
    hf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir, back = tmp_path / "model", tmp_path / "back"
    assert run(["model", "import", str(hf_dir), str(model_dir)], capsys)[0] == 0
    assert run(["model", "export", str(model_dir), str(back)], capsys)[0] == 0
    reader = st.TensorReader()
    original, exported = st.index_dir(hf_dir), st.index_dir(back)
    assert original.keys() == exported.keys()
    assert all(np.array_equal(reader.get(original[k]), reader.get(exported[k])) for k in original)

    code, out, _ = run(
        ["model", "score", "--model", str(model_dir), "--token-ids", "5,17,99,3", "--json"], capsys
    )
    assert code == 0
    result = json.loads(out)
    assert result["tokens"] == [5, 17, 99, 3] and len(result["logprobs"]) == 3
    assert all(v < 0 for v in result["logprobs"])
    assert abs(result["sum"] - sum(result["logprobs"])) < 1e-4


def test_sample_with_each_kernel_choice_gives_the_same_greedy_tokens(
    hf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = tmp_path / "model"
    assert run(["model", "import", str(hf_dir), str(model_dir)], capsys)[0] == 0
    tokens = {}
    for kernels in ("auto", "xla", "pallas"):  # pallas: interpreted, off the GPU
        code, out, _ = run(
            ["sample", "--model", str(model_dir), "--token-ids", "5,17,99", "--temperature", "0"]
            + ["--max-new-tokens", "4", "--decode-kernels", kernels, "--json"],
            capsys,
        )
        assert code == 0
        tokens[kernels] = json.loads(out)["samples"][0]["tokens"]
    assert len(tokens["xla"]) == 4 and tokens["auto"] == tokens["xla"] == tokens["pallas"]
    with pytest.raises(SystemExit) as exit_info:
        drtriton_cli.main(
            ["sample", "--model", str(model_dir), "--token-ids", "1"] + ["--decode-kernels", "cuda"]
        )
    assert exit_info.value.code == 2


def test_bad_input_is_one_line_and_status_2(
    hf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_usage_error(
        run(["model", "import", str(tmp_path / "absent"), str(tmp_path / "x")], capsys),
        "no such directory",
    )
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((hf_dir / "config.json").read_text())
    tensors = {
        name: np.array(st.TensorReader().get(info)) for name, info in st.index_dir(hf_dir).items()
    }
    tensors["model.layers.0.self_attn.extra.weight"] = np.zeros(3, np.float32)
    st.write_file(bad / st.SINGLE_FILE, tensors)
    assert_usage_error(
        run(["model", "import", str(bad), str(tmp_path / "y")], capsys),
        "unknown tensors model.layers.0.self_attn.extra.weight",
    )
    assert_usage_error(
        run(["model", "export", str(tmp_path / "absent"), str(tmp_path / "z")], capsys),
        "no such directory",
    )
    assert_usage_error(
        run(["model", "score", "--model", str(tmp_path / "absent"), "--token-ids", "1,2"], capsys),
        "no such directory",
    )
    assert_usage_error(
        run(["model", "score", "--model", str(hf_dir), "--token-ids", "1,x"], capsys),
        "comma-separated",
    )
    assert_usage_error(
        run(["model", "score", "--model", str(hf_dir), "--text-file", "t.txt"], capsys),
        "no tokenizer.json",
    )
    assert_usage_error(
        run(["sample", "--model", str(tmp_path / "absent"), "--token-ids", "1"], capsys),
        "no such directory",
    )
    assert_usage_error(
        run(
            ["tokenizer", "train", str(tmp_path / "absent.jsonl"), "--out", str(tmp_path / "t")],
            capsys,
        ),
        "no such file",
    )


def test_tokenizer_init_and_text_sampling_without_torch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "pairs.jsonl"
    data.write_text(
        "\n".join(json.dumps({"source": PROGRAM, "completion": KERNEL}) for _ in range(3)) + "\n"
    )
    (tmp_path / "extra.txt").write_text(PROGRAM.replace("relu", "sigmoid"))
    tok_dir, model_dir = tmp_path / "tok", tmp_path / "model"
    code, out, _ = run(
        [
            "tokenizer",
            "train",
            str(data),
            str(tmp_path / "extra.txt"),
            "--out",
            str(tok_dir),
            "--vocab-size",
            "400",
            "--min-frequency",
            "1",
        ],
        capsys,
    )
    assert code == 0 and "BPE" in out

    import learner.tokenizer as tokenizer

    tok = tokenizer.load_tokenizer(tok_dir)
    for special in tokenizer.SPECIAL_TOKENS:
        assert len(tok.encode(special, add_special_tokens=False)) == 1
    assert tok.eos_token == tokenizer.EOS
    assert tok.decode(tok.encode(KERNEL, add_special_tokens=False)) == KERNEL

    assert run(["model", "init", str(model_dir), "--tokenizer", str(tok_dir)], capsys)[0] == 0
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(PROGRAM + "<triton_code>\n")
    script = (
        "import json, sys, drtriton_cli\n"
        f"code = drtriton_cli.main(['sample', '--model', {str(model_dir)!r}, '--prompt-file', {str(prompt)!r},"
        " '--num-samples', '2', '--max-new-tokens', '6', '--json'])\n"
        "print(json.dumps({'code': code, 'torch': 'torch' in sys.modules, 'triton': 'triton' in sys.modules}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    *lines, status = proc.stdout.strip().splitlines()
    assert json.loads(status) == {"code": 0, "torch": False, "triton": False}
    samples = json.loads(lines[-1])["samples"]
    assert [s["prompt_index"] for s in samples] == [0, 0]
    for s in samples:
        assert 1 <= len(s["tokens"]) == len(s["logprobs"]) <= 6
        assert isinstance(s["text"], str) and s["finish_reason"] in ("length", "eos", "stop")
