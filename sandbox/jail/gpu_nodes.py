"""Which NVIDIA device nodes a candidate's /dev holds: the driver's own and its one GPU's.

A CUDA process needs /dev/nvidiactl and /dev/nvidia-uvm (with /dev/nvidia-uvm-tools where
the host has it), and /dev/nvidiaN for each GPU it uses, N being that GPU's device minor. A
worker is placed on one GPU (`sandbox.placement`), so its candidates get that GPU's node
and no other: the host's other GPUs, their memory and the workers timing there stay out of
reach.

The GPU is the one `CUDA_VISIBLE_DEVICES` names, read as CUDA reads it: a `GPU-<uuid>`
(which the grader gives its candidates, `sandbox.process.candidate_env`) names one GPU
whatever order CUDA counts in; an index counts GPUs in PCI bus order, CUDA's order under
`CUDA_DEVICE_ORDER=PCI_BUS_ID` and, for GPUs of a single model, under its default too. The
driver's table of GPUs gives each one's bus id, UUID and minor
(/proc/driver/nvidia/gpus/<bus id>/information, else `nvidia-smi`). Where the GPU cannot
be told (a MIG instance, an index among GPUs of several models, no table, a node missing),
every GPU's node is bound and the reason is returned: the jail reports it and the server
lists it among its isolation features, never silently.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DRIVER_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
MIG_CAPS = "nvidia-caps"  # MIG instances' capability nodes (every instance's)
SMI_QUERY = ("nvidia-smi", "--query-gpu=pci.bus_id,minor_number,uuid,name", "--format=csv,noheader")
SMI_TIMEOUT_S = 20.0
_BUS_ID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


@dataclass(frozen=True)
class Gpu:
    """One GPU as the driver lists it."""

    bus_id: str  # normalised: "0000:3b:00.0"
    minor: int  # its node is /dev/nvidia<minor>
    uuid: str  # "GPU-..."
    model: str


def normalise_bus_id(text: str) -> str:
    """A PCI address as the driver's /proc table spells it ("00000000:3B:00.0", nvidia-smi's
    form, becomes "0000:3b:00.0"); ValueError if it is none."""
    found = _BUS_ID.match(text.strip())
    if found is None:
        raise ValueError(f"not a PCI bus id: {text!r}")
    domain, bus, device, function = (int(part, 16) for part in found.groups())
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function}"


def parse_information(text: str, bus_id: str = "") -> Gpu | None:
    """One GPU from its /proc/driver/nvidia/gpus/<bus id>/information ("Key: value" lines);
    None if the minor or the bus id is missing or malformed."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip().lower()] = value.strip()
    try:
        return Gpu(
            bus_id=normalise_bus_id(fields.get("bus location") or bus_id),
            minor=int(fields["device minor"]),
            uuid=fields.get("gpu uuid", ""),
            model=fields.get("model", ""),
        )
    except (KeyError, ValueError):
        return None


def read_driver_table(proc_root: str = "/proc") -> list[Gpu]:
    """Every GPU in the driver's /proc table, by bus id ([] where there is none)."""
    gpus = []
    for path in sorted(glob.glob(os.path.join(proc_root, "driver/nvidia/gpus/*/information"))):
        try:
            with open(path) as handle:
                text = handle.read(1 << 16)
        except OSError:
            continue
        gpu = parse_information(text, os.path.basename(os.path.dirname(path)))
        if gpu is not None:
            gpus.append(gpu)
    return sorted(gpus, key=lambda g: g.bus_id)


def parse_smi(text: str) -> list[Gpu]:
    """GPUs from `nvidia-smi --query-gpu=pci.bus_id,minor_number,uuid,name --format=csv,noheader`;
    lines without a minor ("[N/A]") are left out."""
    gpus = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",", 3)]
        if len(parts) != 4:
            continue
        try:
            gpus.append(Gpu(normalise_bus_id(parts[0]), int(parts[1]), parts[2], parts[3]))
        except ValueError:
            continue
    return sorted(gpus, key=lambda g: g.bus_id)


def smi_table() -> list[Gpu]:
    """The GPUs as `nvidia-smi` lists them ([] without it)."""
    try:
        done = subprocess.run(
            SMI_QUERY, capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_smi(done.stdout)


def select(visible: str | None, gpus: Sequence[Gpu], order: str | None) -> tuple[list[Gpu], str]:
    """The GPUs `visible` (a `CUDA_VISIBLE_DEVICES` value; None: unset) names among `gpus`
    (the driver's table), and '' ; or ([], why they cannot be told).

    Like CUDA, the list ends at the first entry that names no GPU.
    """
    if not gpus:
        return [], "the driver lists no GPU (no /proc/driver/nvidia/gpus, no nvidia-smi)"
    by_bus = sorted(gpus, key=lambda g: g.bus_id)
    if visible is None:
        return by_bus, ""
    chosen: list[Gpu] = []
    for entry in (part.strip() for part in visible.split(",")):
        if entry.upper().startswith("MIG-"):
            return [], f"{entry} is a MIG instance: its GPU's node is not told apart"
        if entry.isdigit():
            if order != "PCI_BUS_ID" and len({g.model for g in by_bus}) > 1:
                return [], (
                    f"GPU {entry} is an index among GPUs of several models and "
                    "CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA's order is not known"
                )
            if int(entry) >= len(by_bus):
                break
            gpu = by_bus[int(entry)]
        elif entry.upper().startswith("GPU-"):
            matches = [g for g in by_bus if g.uuid.lower().startswith(entry.lower())]
            if len(matches) != 1:
                break
            gpu = matches[0]
        else:
            break
        if gpu not in chosen:
            chosen.append(gpu)
    if not chosen:
        return [], f"CUDA_VISIBLE_DEVICES={visible!r} names none of the driver's GPUs"
    return chosen, ""


def device_nodes(
    visible: str | None, order: str | None, gpus: Sequence[Gpu], dev_root: str = "/dev"
) -> tuple[list[str], str]:
    """The NVIDIA nodes under `dev_root` a candidate's /dev gets, and '' when they are only
    the GPUs `visible` names (else why every GPU's node is there)."""
    driver = [os.path.join(dev_root, name) for name in DRIVER_NODES]
    driver = [path for path in driver if os.path.exists(path)]
    every = sorted(
        (p for p in glob.glob(os.path.join(dev_root, "nvidia[0-9]*")) if _minor(p) is not None),
        key=lambda p: _minor(p) or 0,
    )
    mig = any(part.strip().upper().startswith("MIG-") for part in (visible or "").split(","))
    chosen, why = select(visible, gpus, order)
    if chosen:
        own = [os.path.join(dev_root, f"nvidia{gpu.minor}") for gpu in chosen]
        absent = [path for path in own if not os.path.exists(path)]
        if not absent:
            return driver + own, ""
        why = f"{absent[0]} is not on this host"
    elif len(every) <= 1 and not mig:
        why = ""  # unnamed, but one GPU node on the host: nothing else to keep out
    caps = [p for p in [os.path.join(dev_root, MIG_CAPS)] if mig and os.path.exists(p)]
    return driver + every + caps, why


def _minor(path: str) -> int | None:
    """N of a /dev/nvidiaN path (None for any other name)."""
    digits = os.path.basename(path).removeprefix("nvidia")
    return int(digits) if digits.isdigit() else None


@functools.cache
def _host_nodes(visible: str | None, order: str | None) -> tuple[tuple[str, ...], str]:
    gpus = read_driver_table() or smi_table()
    nodes, why = device_nodes(visible, order, gpus)
    return tuple(nodes), why


def for_env(env: Mapping[str, str]) -> tuple[list[str], str]:
    """This host's NVIDIA nodes for a candidate with environment `env` (`device_nodes`);
    decided once per (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER) in a process."""
    nodes, why = _host_nodes(env.get("CUDA_VISIBLE_DEVICES"), env.get("CUDA_DEVICE_ORDER"))
    return list(nodes), why
