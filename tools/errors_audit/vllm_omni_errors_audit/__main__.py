"""``python -m vllm_omni_errors_audit``: the ``vllm-omni errors audit`` command."""

from __future__ import annotations

import sys

from vllm_omni_errors_audit.cli import main

# Guarded: spawn and forkserver workers of the process pool import the main
# module again (as __mp_main__), and must not start another audit.
if __name__ == "__main__":
    sys.exit(main())
