# Tries: as whatever user it runs as, read root-only files (the host's /etc/shadow, /root, a
# 0600 root file and a root-owned directory in its own job directory) and list the root.
import json
import os
import time

GO, SECRET, LOCKED = "go", "@@SECRET@@", "@@LOCKED@@"


def attempt(action):
    try:
        return {"ok": True, "value": action()}
    except OSError as error:
        return {"ok": False, "errno": error.errno}


def read(path):
    with open(path) as handle:
        return handle.read()


deadline = time.monotonic() + 60
while not os.path.exists(GO) and time.monotonic() < deadline:
    time.sleep(0.01)


def leave_file():
    with open(os.path.join(LOCKED, "planted"), "w") as handle:
        handle.write("escaped")


report = {
    "uid": os.getresuid(),
    "gid": os.getresgid(),
    "groups": os.getgroups(),
    "root": sorted(os.listdir("/")),
    "shadow": attempt(lambda: read("/etc/shadow")),
    "root_home": attempt(lambda: os.listdir("/root")),
    "secret": attempt(lambda: read(SECRET)),
    "plant": attempt(leave_file),
    "setuid_back": attempt(lambda: os.setuid(0)),
}
with open("jail_probe.json.tmp", "w") as out:
    json.dump(report, out)
os.rename("jail_probe.json.tmp", "jail_probe.json")
