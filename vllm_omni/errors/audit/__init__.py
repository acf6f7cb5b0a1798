"""The migration audit (DESIGN §8): ``vllm-omni errors audit PATH...``.

Inventories raise sites by exception name and top-level folder with Python's
``ast``, and reports the error handling the migration removes: raw
ValueError-family raises, broad excepts turned into 4xx, error responses
without a status, status-range guessing, and HTTPException outside
``vllm_omni/errors``. Output as text, JSON, Markdown or SARIF; an allowlist
with a reason per entry; a baseline that only ratchets down.

Modules: ``rules`` (the rule and name tables), ``scanner`` (one file's AST),
``cache`` (results by content hash), ``runner`` (files, processes, report),
``allowlist``, ``baseline``, ``formats``, ``cli``.

Everything here imports the standard library only - never vLLM, torch or
FastAPI - so the command starts in well under a second on any machine.
"""
