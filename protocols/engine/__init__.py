"""The stage engine: one protocol-blind runner for every protocol (docs/architecture.md).

A protocol *declares* its stages (`StageSpec`: key, seed, upstream keys) and passes its hooks (`Hooks`: identity,
reuse, run, publish, job command); the engine plans, refuses changed stages before any work, reuses finished ones,
runs the rest through an executor (in this process, a pool, or SLURM jobs), holds the locks, reports progress and
status, and hands the finished results to the protocol's `publish`. The engine never imports a protocol.
"""
from protocols.engine.spec import Hooks, StageSpec  # noqa: F401
