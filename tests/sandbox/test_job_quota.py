"""A job directory the kernel keeps within its size, and a /dev with only the job's GPU.

The quota (`sandbox.jail.quota`): each job directory is a tmpfs of its own; a candidate
that fills it is stopped by ENOSPC with `resource_limit`, the grader's own files come on top
and are allocated ahead (so the grader goes on), and nothing is left on the host. The GPU
nodes (`sandbox.jail.gpu_nodes`): pure functions over fake /proc and /dev trees choose the
driver's nodes and the one GPU's, or say why they cannot.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sandbox.config import SandboxConfig
from sandbox.grader import Grader, Job, failure_verdict
from sandbox.isolation import TEST_FIRST_ACTION_ENV, Limits, features, namespaces_available
from sandbox.jail import gpu_nodes, quota, rootfs
from sandbox.jail.gpu_nodes import Gpu
from sandbox.process import CandidateProcess, candidate_env, own_gpu
from sandbox.result import VerifyResult
from sandbox.transfer import Exchange, JobDirectoryFull
from sandbox.zygote import Zygote
from tests.sandbox.conftest import GOOD_RELU, RELU_PROBLEM, cpu_interpreter_problem

needs_root = pytest.mark.skipif(not namespaces_available(), reason="mounting a tmpfs needs root")
MB = 1 << 20

# -- which GPU nodes ----------------------------------------------------------------------------

# Four GPUs whose minors do not follow their bus order: only the bus id tells them apart.
H100 = "NVIDIA H100 80GB HBM3"
FAKE_GPUS = [
    Gpu("0000:18:00.0", 2, "GPU-1111aaaa-0000-0000-0000-000000000000", H100),
    Gpu("0000:3b:00.0", 0, "GPU-2222bbbb-0000-0000-0000-000000000000", H100),
    Gpu("0000:86:00.0", 3, "GPU-3333cccc-0000-0000-0000-000000000000", H100),
    Gpu("0000:af:00.0", 1, "GPU-4444dddd-0000-0000-0000-000000000000", H100),
]
INFORMATION = """\
Model: \t\t {model}
IRQ:   \t\t 123
GPU UUID: \t {uuid}
Video BIOS: \t 96.00.74.00.01
Bus Type: \t PCIe
DMA Size: \t 52 bits
Bus Location: \t {bus}
Device Minor: \t {minor}
GPU Excluded:\t No
"""


def fake_host(root: Path, gpus: list[Gpu], nodes: list[str] | None = None) -> tuple[str, str]:
    """A /proc with the driver's table of `gpus` and a /dev with their nodes (plain files
    stand for device nodes); (proc root, dev root)."""
    proc, dev = root / "proc", root / "dev"
    for gpu in gpus:
        entry = proc / "driver" / "nvidia" / "gpus" / gpu.bus_id.upper()
        entry.mkdir(parents=True)
        (entry / "information").write_text(
            INFORMATION.format(model=gpu.model, uuid=gpu.uuid, bus=gpu.bus_id, minor=gpu.minor)
        )
    dev.mkdir(parents=True)
    names = nodes
    if names is None:
        names = [*gpu_nodes.DRIVER_NODES, "nvidia-modeset", *(f"nvidia{g.minor}" for g in gpus)]
    for name in names:
        (dev / name).touch()
    (dev / "nvidia-caps").mkdir()
    return str(proc), str(dev)


def names(paths: list[str]) -> list[str]:
    return [os.path.basename(p) for p in paths]


DRIVER = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]


def test_the_driver_table_is_read_by_bus_id(tmp_path: Path) -> None:
    proc, _ = fake_host(tmp_path, FAKE_GPUS)
    assert gpu_nodes.read_driver_table(proc) == FAKE_GPUS
    assert gpu_nodes.normalise_bus_id("00000000:3B:00.0") == "0000:3b:00.0"  # nvidia-smi's
    with pytest.raises(ValueError):
        gpu_nodes.normalise_bus_id("3b:00")
    assert gpu_nodes.parse_information("Model: x\nGPU UUID: GPU-1\n") is None  # no minor
    smi = (
        "00000000:3B:00.0, 0, GPU-2222bbbb-0000-0000-0000-000000000000, NVIDIA H100 80GB HBM3\n"
        "00000000:18:00.0, [N/A], GPU-x, NVIDIA H100 80GB HBM3\n"
    )
    assert gpu_nodes.parse_smi(smi) == [FAKE_GPUS[1]]


@pytest.mark.parametrize(
    ("visible", "order", "minor"),
    [
        ("1", None, 0),  # the second GPU in bus order, whose minor is 0
        ("0", "PCI_BUS_ID", 2),
        ("3", None, 1),
        ("GPU-3333cccc-0000-0000-0000-000000000000", None, 3),
        ("GPU-4444dd", None, 1),  # a unique prefix, as CUDA takes it
    ],
)
def test_only_the_named_gpus_node_is_bound(
    tmp_path: Path, visible: str, order: str | None, minor: int
) -> None:
    proc, dev = fake_host(tmp_path, FAKE_GPUS)
    nodes, why = gpu_nodes.device_nodes(visible, order, gpu_nodes.read_driver_table(proc), dev)
    assert why == ""
    assert names(nodes) == [*DRIVER, f"nvidia{minor}"]


def test_several_named_gpus_each_get_their_node(tmp_path: Path) -> None:
    proc, dev = fake_host(tmp_path, FAKE_GPUS)
    gpus = gpu_nodes.read_driver_table(proc)
    nodes, why = gpu_nodes.device_nodes("2,0,9,1", None, gpus, dev)  # 9: CUDA stops there
    assert (names(nodes), why) == ([*DRIVER, "nvidia3", "nvidia2"], "")
    every, why = gpu_nodes.device_nodes(None, None, gpus, dev)  # unset: CUDA sees them all
    assert (names(every), why) == ([*DRIVER, "nvidia2", "nvidia0", "nvidia3", "nvidia1"], "")


@pytest.mark.parametrize(
    ("visible", "order", "reason"),
    [
        ("MIG-5a5a5a5a-0000-0000-0000-000000000000", None, "MIG instance"),
        ("GPU-9999", None, "names none of the driver's GPUs"),
        ("GPU-", None, "names none"),  # a prefix of every UUID: not unique
        ("1", None, "several models"),
    ],
)
def test_a_gpu_that_cannot_be_told_binds_every_node_and_says_why(
    tmp_path: Path, visible: str, order: str | None, reason: str
) -> None:
    mixed = [*FAKE_GPUS[:3], Gpu("0000:af:00.0", 1, FAKE_GPUS[3].uuid, "NVIDIA H200")]
    proc, dev = fake_host(tmp_path, mixed)
    nodes, why = gpu_nodes.device_nodes(visible, order, gpu_nodes.read_driver_table(proc), dev)
    assert reason in why
    expected = [*DRIVER, "nvidia0", "nvidia1", "nvidia2", "nvidia3"]
    assert names(nodes) == expected + (["nvidia-caps"] if visible.startswith("MIG") else [])
    assert "nvidia-modeset" not in names(nodes)


def test_by_bus_order_an_index_is_exact_even_among_models(tmp_path: Path) -> None:
    mixed = [*FAKE_GPUS[:3], Gpu("0000:af:00.0", 1, FAKE_GPUS[3].uuid, "NVIDIA H200")]
    proc, dev = fake_host(tmp_path, mixed)
    nodes, why = gpu_nodes.device_nodes("1", "PCI_BUS_ID", gpu_nodes.read_driver_table(proc), dev)
    assert (names(nodes), why) == ([*DRIVER, "nvidia0"], "")


def test_a_missing_node_or_table_falls_back_and_says_so(tmp_path: Path) -> None:
    proc, dev = fake_host(tmp_path, FAKE_GPUS, nodes=["nvidiactl", "nvidia-uvm", "nvidia2"])
    gpus = gpu_nodes.read_driver_table(proc)
    nodes, why = gpu_nodes.device_nodes("1", None, gpus, dev)  # minor 0: no /dev/nvidia0
    assert "nvidia0 is not on this host" in why
    assert names(nodes) == ["nvidiactl", "nvidia-uvm", "nvidia2"]  # all there is
    # No driver table at all, several GPU nodes: every one, and why.
    _, many = fake_host(tmp_path / "many", [], nodes=[*DRIVER, "nvidia0", "nvidia1"])
    nodes, why = gpu_nodes.device_nodes("0", None, [], many)
    assert "lists no GPU" in why and names(nodes) == [*DRIVER, "nvidia0", "nvidia1"]
    # ... and with one GPU node on the host there is nothing else to keep out.
    _, one = fake_host(tmp_path / "one", [], nodes=[*DRIVER, "nvidia0"])
    assert gpu_nodes.device_nodes("0", None, [], one) == (
        [f"{one}/{n}" for n in DRIVER] + [f"{one}/nvidia0"],
        "",
    )


@pytest.mark.parametrize(
    ("uuid", "named"),
    [
        ("58e7a2c0-51ae-5d3c-9bbc-7a9e31e9a5c9", "GPU-58e7a2c0-51ae-5d3c-9bbc-7a9e31e9a5c9"),
        ("GPU-58E7A2C0-51AE-5D3C-9BBC-7A9E31E9A5C9", "GPU-58e7a2c0-51ae-5d3c-9bbc-7a9e31e9a5c9"),
        ("not a uuid", None),
        ("", None),
    ],
)
def test_candidates_name_the_graders_gpu_by_its_uuid(
    monkeypatch: pytest.MonkeyPatch, uuid: str, named: str | None
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert own_gpu() is None or torch.cuda.is_initialized()  # CUDA is never started for it
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: SimpleNamespace(uuid=uuid))
    assert own_gpu() == named
    assert candidate_env("/job", "cuda")["CUDA_VISIBLE_DEVICES"] == (named or "3")
    assert candidate_env("/job", "cpu")["CUDA_VISIBLE_DEVICES"] == ""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-5a5a5a5a-0000-0000-0000-000000000000")
    assert own_gpu() is None  # a MIG instance keeps the name it was given


def test_the_plan_binds_the_nodes_it_is_given_and_no_other(tmp_path: Path) -> None:
    node = tmp_path / "nvidia7"
    node.touch()
    job = tmp_path / "job"
    job.mkdir()
    plan = rootfs.plan_root(str(job), "cuda", 65534, 16, {}, "/nonexistent", nvidia=[str(node)])
    binds = {e.path for e in plan if e.kind == "bind" and e.devices}
    assert str(node) in binds
    assert not any("nvidia" in path for path in binds - {str(node)})
    cpu = rootfs.plan_root(str(job), "cpu", 65534, 16, {}, "/nonexistent", nvidia=[str(node)])
    assert not any("nvidia" in e.path for e in cpu)


def test_what_cannot_be_raised_is_reported_not_hidden() -> None:
    ready = {
        "jail_missing": [
            "job directory quota (it is no size-limited tmpfs of its own)",
            "GPU device nodes (every GPU's node is bound: GPU-9 names none)",
        ]
    }
    reply = {"uid": 65534, "pid": 1, "capabilities": False}
    found = {f["name"]: f for f in features(ready, reply, connected=False, wrote_outside=False)}
    assert not found["job_dir_quota"]["available"]
    assert "no size-limited tmpfs" in found["job_dir_quota"]["detail"]
    assert not found["private_dev"]["available"]
    assert "GPU-9 names none" in found["private_dev"]["detail"]
    whole = features({"jail_missing": []}, reply, connected=False, wrote_outside=False)
    assert {f["name"] for f in whole if f["available"]} >= {"job_dir_quota", "private_dev"}


# -- the quota and the grader's files ------------------------------------------------------------


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB job directory of 16 names (a tmpfs of its own), detached afterwards."""
    job = tmp_path / "job"
    job.mkdir()
    assert quota.mount(str(job), 1, os.getuid(), files=16)
    try:
        yield job
    finally:
        quota.release(str(job))
    assert not os.path.ismount(job)


def fill(directory: Path, chunk: int = 64 << 10) -> int:
    """Grow one new file in `directory` until the directory is full (as a candidate would);
    the bytes written."""
    written = 0
    with open(directory / f"fill-{len(os.listdir(directory))}", "wb") as handle:
        for _ in range(1 << 16):
            try:
                written += os.write(handle.fileno(), b"\0" * chunk)
            except OSError as error:
                assert error.errno == errno.ENOSPC
                return written
    raise AssertionError("never full")


def cap_of(directory: Path) -> tuple[int, int]:
    info = os.statvfs(directory)
    return info.f_blocks * info.f_frsize, info.f_files


@needs_root
def test_the_graders_files_fit_however_full_the_candidate_left_its_directory(
    capped: Path,
) -> None:
    assert fill(capped) <= 1 * MB
    allowance = cap_of(capped)
    x = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB: four times the whole cap
    with Exchange(str(capped), "cpu", shared=False) as exchange:
        (spec,) = exchange.put("in", [x], writable=False)
        (out,) = exchange.put("out", [x], writable=True)
        (after,) = exchange.blanks([spec], "after")
        assert cap_of(capped)[0] >= allowance[0] + 12 * MB
        for made in (spec, out, after):  # allocated whole: no hole a write could miss
            assert os.stat(made["path"]).st_blocks * 512 >= 4 * MB
        assert torch.equal(exchange.read(spec), x)
        assert torch.isnan(exchange.read(out)).all()
        exchange.release([out])
        assert cap_of(capped)[0] < allowance[0] + 12 * MB  # its room given back at once
    assert cap_of(capped) == allowance  # all of it, once the command's files are gone


@needs_root
def test_a_candidate_that_used_every_name_still_leaves_the_grader_its_own(
    capped: Path,
) -> None:
    made = 0
    while True:
        try:
            (capped / f"n{made}").touch()
        except OSError as error:
            assert error.errno == errno.ENOSPC
            break
        made += 1
    assert made < 16
    with Exchange(str(capped), "cpu", shared=False) as exchange:
        (spec,) = exchange.put("in", [torch.ones(4)], writable=False)
        assert torch.equal(exchange.read(spec), torch.ones(4))


@needs_root
def test_room_taken_between_the_cap_and_the_allocation_is_the_candidates_doing(
    capped: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only something writing while the grader makes its files (a thread or process the
    candidate left running) can take the room made for them: tampering, not sandbox_error."""
    allocate = quota.allocate

    def candidate_first(fd: int, nbytes: int) -> None:
        fill(capped)  # the candidate takes the room the cap just grew by
        allocate(fd, nbytes)

    monkeypatch.setattr(quota, "allocate", candidate_first)
    with (
        Exchange(str(capped), "cpu", shared=False) as exchange,
        pytest.raises(JobDirectoryFull) as raised,
    ):
        exchange.put("in", [torch.ones(1 << 18)], writable=False)
    verdict, message = failure_verdict(raised.value, VerifyResult(verdict=""), 60.0)
    assert verdict == "tampering" and "job directory" in message


@needs_root
def test_without_a_cap_a_full_disk_is_the_hosts_shortage(tmp_path: Path) -> None:
    """A job directory that is no tmpfs of its own, on a full file system: the grader's
    error (retried as `sandbox_error`), never pinned on the candidate."""
    host = tmp_path / "host"
    host.mkdir()
    assert quota.mount(str(host), 1, os.getuid())
    try:
        job = host / "job"
        job.mkdir()
        with (
            Exchange(str(job), "cpu", shared=False) as exchange,
            pytest.raises(OSError) as raised,
        ):
            exchange.put("in", [torch.ones(1 << 20)], writable=False)
        assert not isinstance(raised.value, JobDirectoryFull)
        assert raised.value.errno == errno.ENOSPC
    finally:
        quota.release(str(host))


def test_job_mounts_left_below_a_root_are_found_deepest_first() -> None:
    info = (
        "22 1 0:21 / / rw - ext4 /dev/sda1 rw\n"
        "40 22 0:40 / /srv/jobs/runner-1/abc rw,nosuid - tmpfs tmpfs rw,size=1024k\n"
        "41 40 0:41 / /srv/jobs/runner-1/abc/inner rw - tmpfs tmpfs rw\n"
        "42 22 0:42 / /srv/jobs/with\\040space rw - tmpfs tmpfs rw\n"
        "43 22 0:43 / /srv/jobs rw - tmpfs tmpfs rw\n"  # the root itself stays
        "44 22 0:44 / /srv/jobs-other/x rw - tmpfs tmpfs rw\n"
        "45 22 8:2 / /srv/jobs/disk rw - ext4 /dev/sda2 rw\n"
    )
    assert quota.mounts_below("/srv/jobs/", info) == [
        "/srv/jobs/runner-1/abc/inner",
        "/srv/jobs/runner-1/abc",
        "/srv/jobs/with space",
    ]


@needs_root
def test_job_mounts_a_dead_grader_left_are_detached(tmp_path: Path) -> None:
    jobs = [tmp_path / "gpu-0" / "a", tmp_path / "gpu-0" / "b"]
    for job in jobs:
        job.mkdir(parents=True)
        assert quota.mount(str(job), 1, 0)
        (job / "left").write_bytes(b"x" * 1000)
    quota.release_below(str(tmp_path))
    assert not any(os.path.ismount(job) or (job / "left").exists() for job in jobs)


# -- a candidate filling its directory, through the grader -------------------------------------

_FILL = """
import os

def _fill():
    os.makedirs(".triton", exist_ok=True)
    chunk = bytes(1 << 20)
    for i in range(1 << 12):
        with open(os.path.join(".triton", f"fill-{i}"), "wb") as handle:
            handle.write(chunk)
"""
FILLS_AND_FAILS = GOOD_RELU.replace(
    "def triton_fused_operator(tensor_0):\n",
    _FILL + "\n\ndef triton_fused_operator(tensor_0):\n    _fill()\n",
)
FILLS_AND_GOES_ON = GOOD_RELU.replace(
    "def triton_fused_operator(tensor_0):\n",
    _FILL
    + "\n\ndef triton_fused_operator(tensor_0):\n    try:\n        _fill()\n"
    + "    except OSError:\n        pass\n",
)


def job_dirs(root: Path) -> list[Path]:
    """Job directories (16 hex digits) left under `root`."""
    return [p for p in root.iterdir() if len(p.name) == 16 and p.is_dir()]


@needs_root
def test_a_candidate_filling_its_job_directory_is_stopped_and_the_grader_goes_on(
    tmp_path: Path,
) -> None:
    problem = cpu_interpreter_problem()
    if problem:
        pytest.skip(problem)
    root = tmp_path / "jobs"
    config = SandboxConfig(
        device="cpu", job_root=str(root), candidate_job_dir_mb=8, static_gate=False
    )
    grader = Grader(config, "cpu")
    assert grader.limits.job_dir_mb == 8
    try:

        def grade(candidate: str) -> VerifyResult:
            job = Job(problem=RELU_PROBLEM, candidate=candidate, timing=False, trials=2)
            return grader.grade(job)

        filled = grade(FILLS_AND_FAILS)
        assert filled.verdict == "resource_limit", (filled.message, filled.candidate_log)
        assert "No space left" in filled.message
        # Full to its cap on every trial, the candidate still gets the inputs and its
        # outputs through: the grader's files were room of their own.
        survived = grade(FILLS_AND_GOES_ON)
        assert survived.verdict == "correct", (survived.message, survived.candidate_log)
        assert grade(GOOD_RELU).verdict == "correct"
    finally:
        grader.close()
    deadline = time.monotonic() + 30
    while job_dirs(root) and time.monotonic() < deadline:  # reapers finish off the last
        time.sleep(0.05)
    with open("/proc/self/mountinfo") as info:
        assert not [line for line in info if f" {root}/" in line]
    assert job_dirs(root) == []


# -- on a GPU: the jail's /dev, seen from inside -------------------------------------------------

GPU_PROBE = """
import json, os
import torch
props = torch.cuda.get_device_properties(0)
report = {
    "dev": sorted(os.listdir("/dev")),
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "count": torch.cuda.device_count(),
    "uuid": str(props.uuid),
}
with open("jail_probe.json", "w") as out:
    json.dump(report, out)
"""


@pytest.mark.gpu
@needs_root
def test_a_gpu_candidate_gets_its_own_gpus_node_and_no_other(tmp_path: Path) -> None:
    """A jailed CUDA candidate's /dev holds the driver's nodes and its GPU's own (the minor
    the driver gives that GPU), and CUDA in it sees that one GPU, named by its UUID."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    torch.cuda.init()
    named = own_gpu()
    assert named is not None, "CUDA gives this GPU no UUID"
    table = gpu_nodes.read_driver_table() or gpu_nodes.smi_table()
    (mine,) = [gpu for gpu in table if gpu.uuid.lower() == named.lower()]
    probe = tmp_path / "probe.py"
    probe.write_text(GPU_PROBE)
    home, jobs = tmp_path / "zygote", tmp_path / "jobs"
    home.mkdir()
    env = {**candidate_env(str(home), "cuda"), TEST_FIRST_ACTION_ENV: str(probe)}
    assert env["CUDA_VISIBLE_DEVICES"] == named
    zygote = Zygote("cuda", env)
    try:
        limits = Limits(job_dir_mb=64, use_address_space_limit=False)
        proc = CandidateProcess(zygote, str(jobs), "cuda", limits)
        try:
            ready = proc.wait_ready(time.monotonic() + 300)
            report = json.loads(Path(proc.job_dir, "jail_probe.json").read_text())
        finally:
            proc.close()
    finally:
        zygote.close()
    assert not [m for m in ready["jail_missing"] if m.startswith("GPU device nodes")]
    driver = {name for name in gpu_nodes.DRIVER_NODES if os.path.exists(f"/dev/{name}")}
    assert {n for n in report["dev"] if n.startswith("nvidia")} == driver | {f"nvidia{mine.minor}"}
    assert report["visible"] == named and report["count"] == 1
    assert named.lower().endswith(report["uuid"].lower().removeprefix("gpu-"))
