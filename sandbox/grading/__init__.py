"""The grader's steps, each readable alone; `sandbox.grader.Grader` runs them in order.

- `job`: a job and its context (problem, tolerances, secret seeds, deadline, result).
- `stages`: the job's stage clock (`VerifyResult.stage_seconds`).
- `trials`: the candidate driven through load, compile pass, trials and the checks.
- `judgment`: outputs against the reference, with the reference's own rounding allowed.
- `timed`: the candidate's timed loops and the eager / torch.compile baselines (GPU).
- `gpu`: the GPU shared with other graders: gate holds, memory sizing and release.
"""
