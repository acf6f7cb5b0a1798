"""The served ``/openapi.json``, narrowed to the running pipeline, and the
check that holds every JSON and form request to it.

Building blocks (``schema``), narrowing (``narrowing``, one module per
route family), the document (``document``), serving it (``serving``) and
checking bodies against it (``checking``); what it promises is in
docs/serving.md, "Request fields: honoured or refused" (docs/design.md §10).
It decides nothing about what is honoured (``fields.py`` does), builds no
responses, and imports no route or serving module.
"""

from vllm_omni.entrypoints.openai.openapi.checking import check_body
from vllm_omni.entrypoints.openai.openapi.images import IMAGE_TYPES
from vllm_omni.entrypoints.openai.openapi.schema import decimal_pattern, size_pattern
from vllm_omni.entrypoints.openai.openapi.serving import endpoint, prepare, served

__all__ = [
    "IMAGE_TYPES",
    "check_body",
    "decimal_pattern",
    "endpoint",
    "prepare",
    "served",
    "size_pattern",
]
