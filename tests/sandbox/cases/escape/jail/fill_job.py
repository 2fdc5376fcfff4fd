# Tries: fill its job directory (many files, each under the per-file size limit) until the
# file system is full.
import json
import os

written, chunk, error = 0, b"\0" * (1 << 20), 0
try:
    for i in range(1 << 16):
        with open(f"fill-{i}", "wb") as handle:
            handle.write(chunk)
        written += len(chunk)
except OSError as failure:
    error = failure.errno
for name in ("fill-0", "fill-1"):  # room for the report
    os.unlink(name)
with open("jail_probe.json", "w") as out:
    json.dump({"bytes": written, "errno": error}, out)
