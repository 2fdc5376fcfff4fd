"""`drtriton demo`: the whole loop of DRTriton in one command.

tiny programs -> teacher pairs (verified) -> SFT -> a few DRPO steps against a sandbox server
the demo starts and stops -> test-time search with the teacher and the trained policy ->
evaluation of both on a small synthetic suite -> one Markdown table and a speedup curve.

Every stage is a subprocess of the one `drtriton` command line, so the demo holds no logic
of its own beyond choosing sizes, running the stages in order, reusing what an earlier run
finished, and reporting. On a CPU machine it trains a toy in minutes; on a GPU machine the
same command uses the GPU, the `100m-gpu` preset and timing.
"""
