"""The handlers Starlette calls, one module per family of failure.

Each accounts for what it catches like any other failure (``reporting``) and
renders it through ``vllm_omni.errors.render``; ``register`` installs them.
They must not build a status or a body of their own.
"""
