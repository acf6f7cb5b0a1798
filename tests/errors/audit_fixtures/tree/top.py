"""Fixture: a file directly in the audited root (inventory column "(root)")."""

raise ValueError("module level")  # expect: OMNI001
