"""``python -m vllm_omni.errors.audit``: the ``vllm-omni errors audit`` command."""

from __future__ import annotations

import sys

from vllm_omni.errors.audit.cli import main

sys.exit(main())
