"""The stage wire: the messages between the orchestrator and its stages
(``messages``) and the hop marks that time them (``hops``).

Below both sides of the wire: the stages build what they receive and send
from it, the engine routes it; it imports neither (docs/design.md §1, §6).
"""
