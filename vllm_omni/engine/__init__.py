"""The multi-stage runtime: stage wire messages, stage processes, orchestrator.

``messages`` (the wire), ``processes`` and ``launcher`` (stage processes are
forks of one launcher that imports vLLM once),
``stage_worker`` (one stage per process), ``orchestrator`` (routes, deadlines,
fatality) and ``faults`` (drills). Nothing here renders errors for a
transport; clients use ``vllm_omni.entrypoints.async_omni.AsyncOmni``.
Importing this package is cheap: its modules load on demand.
"""
