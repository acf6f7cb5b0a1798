"""The one exception of the audit: a mistake in its command line or inputs.

The command line turns it into exit status 2. Everything else the audit meets
in the audited tree (bad syntax, bad bytes) is a finding, not an exception.
"""

from __future__ import annotations


class AuditUsageError(Exception):
    """A missing path, a malformed allowlist or baseline, or bad options."""
