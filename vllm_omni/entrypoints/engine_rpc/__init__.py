"""One engine, several API server processes (``--api-server-count N``).

The engine process (``vllm-omni serve`` itself) runs the pipeline once:
``AsyncOmni``, its stages and the video job store. Each API server process
serves HTTP on the shared port with an ``EngineClient`` in place of
``AsyncOmni`` and a ``JobsClient`` in place of the job store; both speak to
the ``EngineServer`` in the engine process over one ZMQ socket
(docs/serving.md, "Several API server processes"). Requests, records and
exceptions cross pickled; admission reads a shared ``AdmissionBoard``.
"""

from vllm_omni.entrypoints.engine_rpc.board import AdmissionBoard

__all__ = ["AdmissionBoard"]
