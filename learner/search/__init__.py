"""Test-time search (DESIGN §5): a program cut into fragments of at most K operators, a
kernel per fragment from a policy, the fastest correct composition by dynamic programming.

`run.search_problem` is the entry point; `program`, `values`, `fragments`, `compose`,
`rename`, `assemble` are its steps, each usable alone. Importing this package loads
nothing heavy: torch only where a program's shapes are read (`values`).
"""
