"""Ray for the Ray-backend tests: real instances, loopback only.

Ray binds a node to this host's public address unless told it is not a
cluster; the flag is read when Ray is first imported, so it is set here,
before anything in this package imports Ray. Each test module starts one
Ray instance (or ``Cluster``) and shares it.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# Token auth would write a token under ~/.ray; nothing here leaves 127.0.0.1.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
