# Tries: leave files on the host through the scratch places (/tmp, /dev/shm) and see the
# host's processes, devices and kernel settings through /dev and /proc.
import json
import os

NAME = "@@NAME@@"


def attempt(action):
    try:
        action()
        return {"ok": True}
    except OSError as error:
        return {"ok": False, "errno": error.errno}


def write(path):
    with open(path, "w") as handle:
        handle.write("escaped")


def sysctl():
    with open("/proc/sys/kernel/domainname", "w") as handle:
        handle.write("escaped")


def fill(directory):
    """Write until the file system is full: how much fits."""
    written, chunk = 0, b"\0" * (1 << 20)
    try:
        for i in range(4096):
            with open(os.path.join(directory, f"fill-{i}"), "wb") as handle:
                handle.write(chunk)
            written += len(chunk)
    except OSError as error:
        return {"bytes": written, "errno": error.errno}
    return {"bytes": written, "errno": 0}


report = {
    "tmp": attempt(lambda: write(f"/tmp/{NAME}")),
    "shm": attempt(lambda: write(f"/dev/shm/{NAME}")),
    "dev": sorted(os.listdir("/dev")),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "sysctl": attempt(sysctl),
    "null": attempt(lambda: write("/dev/null")),
    "fill_tmp": fill("/tmp"),
    "fill_shm": fill("/dev/shm"),
}
with open("jail_probe.json.tmp", "w") as out:
    json.dump(report, out)
os.rename("jail_probe.json.tmp", "jail_probe.json")
