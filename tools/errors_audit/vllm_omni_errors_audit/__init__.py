"""The migration audit (docs/design.md §8): ``vllm-omni errors audit PATH...``, also
``python -m vllm_omni_errors_audit PATH...``; a tool of its own beside the
runtime (``tools/errors_audit``), which it never imports.

Inventories raise sites by exception name and top-level folder with Python's
``ast``, and reports the error handling the migration removes: raw
ValueError-family raises, broad excepts turned into 4xx, error responses
without a status, status-range guessing, and HTTPException outside
``vllm_omni/errors``. Output as text, JSON, Markdown or SARIF; an allowlist
with a reason per entry; a baseline that only ratchets down; ``--fix`` and
``--suggest`` rewrite with LibCST.

Modules: ``rules`` (the rule and name tables), ``skeleton`` and ``scanner``
(one file), ``cache`` (results by content hash), ``runner`` (files,
processes, report), ``allowlist``, ``baseline``, ``formats``, ``cli``; for
the rewrites ``flow``, ``rewrite``, ``codemod`` and ``migrate``.

A plain audit imports the standard library only - never vLLM, torch,
FastAPI or LibCST - so the command starts in well under a second.
"""

__version__ = "0.31.0.dev0"
