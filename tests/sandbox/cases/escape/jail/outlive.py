# Tries: outlive the job. The candidate's own process (pid 1 of its namespace) leaves its
# process group, clears its parent-death signal and never exits (the harness's exit is
# replaced by a sleep); a double-forked grandchild in a new session does the same and
# sleeps. Each names itself (its comm) so the host can find it.
import ctypes
import json
import os
import time

libc = ctypes.CDLL(None, use_errno=True)
SELF_NAME, ORPHAN_NAME = b"@@OWN@@", b"@@ORPHAN@@"
PR_SET_NAME, PR_SET_PDEATHSIG = 15, 1


def detach(name):
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    try:
        os.setsid()
    except OSError:
        pass
    result = libc.prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)
    return ctypes.get_errno() if result else 0


report = {"self_pdeathsig_errno": detach(SELF_NAME)}
read_end, write_end = os.pipe()
child = os.fork()
if child == 0:
    os.close(read_end)
    if os.fork() == 0:
        cleared = detach(ORPHAN_NAME)
        os.write(write_end, f"{os.getpid()} {cleared}\n".encode())
        os.close(write_end)
        while True:
            time.sleep(1000)
    os._exit(0)
os.close(write_end)
os.waitpid(child, 0)
line = os.read(read_end, 100).decode().split()
report.update(orphan_pid=int(line[0]), orphan_pdeathsig_errno=int(line[1]))
os._exit = lambda code=0: time.sleep(1 << 30)  # when the grader lets go, stay
with open("jail_probe.json.tmp", "w") as out:
    json.dump(report, out)
os.rename("jail_probe.json.tmp", "jail_probe.json")
