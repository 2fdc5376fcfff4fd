"""The candidate's jail, built from kernel primitives inside each zygote fork.

One module per wall: `rootfs` (a fresh minimal root: the runtime bound read-only, private
/dev, /proc, /tmp and /dev/shm, the job directory), `identity` (an unprivileged uid, no
capabilities, no new privileges), `seccomp` (a table of denied system calls, through
libseccomp), `cgroup` (per-job caps and a kill that reaches every process of the job),
`quota` (a job directory that is a size-limited tmpfs of its own), `gpu_nodes` (which
NVIDIA device nodes its /dev holds: the driver's and its own GPU's). `sandbox.isolation`
puts them together in the order the jail needs.
"""
