"""The server's request limits: one record, its defaults, its CLI options.

``vllm-omni serve`` exposes every field as ``--max-…``; ``build_app`` keeps
the record on ``app.state.limits``. The error boundary enforces the body
limit while the body is read (413), the routes the prompt limit (400 with
``param``), the image routes and the image stage the media limits (422 with
``param``). This module imports nothing heavy: the CLI reads it before it
imports the server.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

__all__ = ["RequestLimits", "add_limit_options"]

_HELP = {
    "max_request_bytes": "largest request body in bytes; larger bodies get 413 "
    "and are not read further",
    "max_prompt_chars": "longest prompt (or speech input) in characters; longer "
    "ones get 400 with param naming the field",
    "max_image_bytes": "largest uploaded image in bytes (422 on the image field)",
    "max_image_pixels": "most pixels (width x height, from the header, before "
    "decoding) of an uploaded image (422 on the image field)",
    "max_image_frames": "most frames of an uploaded animated image (422 on the "
    "image field)",
    "max_ws_message_bytes": "largest WebSocket message (realtime event) in bytes; "
    "a larger one gets an error event (413) and the session closes with 1009",
}


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Bounds on what one request may make the server read or decode."""

    max_request_bytes: int = 20 * 1024 * 1024
    max_prompt_chars: int = 128 * 1024
    max_image_bytes: int = 16 * 1024 * 1024
    max_image_pixels: int = 4096 * 4096
    max_image_frames: int = 64
    max_ws_message_bytes: int = 1024 * 1024

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RequestLimits:
        """The limits in ``args``; a field ``args`` lacks keeps its default."""
        defaults = cls()
        return cls(
            **{
                f.name: getattr(args, f.name, getattr(defaults, f.name))
                for f in fields(cls)
            }
        )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--max-request-bytes`` … ``--max-image-frames`` with their defaults."""
    defaults = RequestLimits()
    group = parser.add_argument_group(
        "request-limits", "How large a request, a file or a message may be."
    )
    for f in fields(RequestLimits):
        default = getattr(defaults, f.name)
        group.add_argument(
            "--" + f.name.replace("_", "-"),
            type=_positive,
            default=default,
            metavar="N",
            help=f"{_HELP[f.name]} (default: {default})",
        )
