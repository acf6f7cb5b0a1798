"""Benchmarks. Each ``bench_*`` module exposes ``run() -> list[dict]`` rows
(``benchmark``, ``ours``, ``baseline``, ``ratio``, ``unit``) and runs alone
as ``python benchmarks/bench_<name>.py``."""
