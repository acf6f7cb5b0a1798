"""Public-text sanitization (DESIGN §5): what may leave the server in an error.

Owns one job: turn arbitrary exception text into text safe to show a client.
It strips tracebacks and ``File "…", line N`` frames, replaces filesystem
paths, memory addresses, credentials, data URIs and long base64 runs, drops
control characters and caps the length. The normalizer calls it once; nothing
else should need to. It must never raise and must be idempotent
(``sanitize(sanitize(x)) == sanitize(x)``), because records are re-checked
when they are read back from the wire.

All patterns live in one table and run as a single alternation, so a message
is scanned once however many rules there are.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = [
    "MAX_MESSAGE_CHARS",
    "sanitize_message",
    "sanitize_parameter",
    "sanitize_request_id",
]

MAX_MESSAGE_CHARS = 1024
# Longer input is cut before scanning: it bounds the work on hostile input,
# and nothing past this point could survive the final cap anyway.
_SCAN_LIMIT = 8 * MAX_MESSAGE_CHARS

_PARAMETER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\[\]-]{0,127}")
_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

_SECRET_NAMES = (
    r"api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key|key"
    r"|access[_-]?token|auth[_-]?token|refresh[_-]?token|token"
    r"|password|passwd|pwd|secret|credentials?"
)

_CONTROL = r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]"

# (name, pattern, replacement). The replacement is a string or, for rules that
# keep part of the match, a function of the match. Order matters where two
# rules could start at the same position: the first listed wins.
_RULES: tuple[tuple[str, str, str | Callable[[re.Match[str]], str]], ...] = (
    ("traceback", r"Traceback \(most recent call last\):(?:\n[ \t]+[^\n]*)*", ""),
    (
        "frame",
        # The lookbehind starts the match only at the first blank of a run, so
        # a long run of blanks is scanned once rather than once per position.
        r"(?<![ \t])[ \t]*File \"[^\"\n]*\", line \d+(?:, in [^\n]*)?"
        r"(?:\n[ \t]+[^\n]*)?",
        "",
    ),
    (
        "private_key",
        r"(?s:-----BEGIN [A-Z ]*PRIVATE KEY-----.*?"
        r"(?:-----END [A-Z ]*PRIVATE KEY-----|\Z))",
        "<redacted>",
    ),
    (
        "data_uri",
        r"\bdata:(?:[\w.+-]+/[\w.+-]+)?(?:;[\w.+-]+(?:=[\w.+-]+)?)*,[^\s\"'<>)\]]*",
        "<data>",
    ),
    ("file_uri", r"\bfile://[^\s\"'<>]*", "<path>"),
    ("url_userinfo", r"(?<=://)[^/\s:@]+:[^/\s@]*@", "<redacted>@"),
    (
        "auth_scheme",
        r"\b(?:[Bb]earer|[Bb]asic)[ \t]+[A-Za-z0-9._~+/=-]+",
        lambda m: m.group(0).split(None, 1)[0] + " <redacted>",
    ),
    ("openai_key", r"\bsk-[A-Za-z0-9_-]{3,}", "<redacted>"),
    ("hf_token", r"\bhf_[A-Za-z0-9]{6,}", "<redacted>"),
    ("aws_key", r"\b(?:AKIA|ASIA)[0-9A-Z]{12,}", "<redacted>"),
    (
        "assignment",
        rf"(?i:(?<![A-Za-z0-9])(?:{_SECRET_NAMES}))[ \t]*=[ \t]*"
        r"(?:\"[^\"\n]*\"?|'[^'\n]*'?|[^\s,;&)\]}]+)",
        lambda m: m.group(0).split("=", 1)[0].rstrip() + "=<redacted>",
    ),
    ("address_suffix", r" at 0x[0-9a-fA-F]+", ""),
    ("address", r"\b0x[0-9a-fA-F]{8,}\b", "<address>"),
    ("base64_run", r"[A-Za-z0-9+/]{64,}={0,2}", "<data>"),
    ("windows_path", r"\b[A-Za-z]:\\[^\s\"'<>|]*", "<path>"),
    (
        "posix_path",
        r"(?<![\w:/.~<-])(?:~|\.{1,2})?/[\w.@+-]+(?:/[\w.@+-]*)+"
        r"|(?<![\w:/.~<-])(?:~|\.{1,2})/[\w.@+-]+"
        r"|(?<![\w:/.~<-])/[\w@+-]+\.\w+",
        "<path>",
    ),
    ("control", _CONTROL, ""),
)

_COMBINED = re.compile(
    "|".join(f"(?P<{name}>{pattern})" for name, pattern, _ in _RULES)
)
_REPLACEMENTS = {name: replacement for name, _, replacement in _RULES}

# Substrings of which every match of a rule contains one. A text with none of
# them, no control character and no base64 run of 64 characters matches no
# rule; most messages are such texts, and these checks cost a fraction of the
# full alternation.
_TRIGGERS = (
    "Traceback",  # traceback
    'File "',  # frame
    "-----BEGIN ",  # private_key
    "data:",  # data_uri
    "://",  # file_uri, url_userinfo
    "earer",  # auth_scheme: [Bb]earer
    "asic",  # auth_scheme: [Bb]asic
    "sk-",  # openai_key
    "hf_",  # hf_token
    "AKIA",  # aws_key
    "ASIA",  # aws_key
    "=",  # assignment
    "0x",  # address_suffix, address
    ":\\",  # windows_path
    "/",  # posix_path, and any base64 run that contains a "/"
)
_CONTROL_RE = re.compile(_CONTROL)  # control
_BASE64_RUN_RE = re.compile(r"[A-Za-z0-9+]{64}")  # base64_run without a "/"

# Recent results that are fixed points (never raw input), so a hit returns
# exactly what a full scan would. It turns the record's re-check of a message
# it was just given, and repeated messages (a storm of 503s), into a lookup.
_CLEAN: dict[str, None] = {}
_CLEAN_MAX = 1024


def _may_match(text: str) -> bool:
    for trigger in _TRIGGERS:
        if trigger in text:
            return True
    if _CONTROL_RE.search(text) is not None:
        return True
    return len(text) >= 64 and _BASE64_RUN_RE.search(text) is not None


def _clean(text: str) -> str:
    if len(_CLEAN) >= _CLEAN_MAX:
        _CLEAN.clear()
    _CLEAN[text] = None
    return text


def _replace(match: re.Match[str]) -> str:
    replacement = _REPLACEMENTS[match.lastgroup or ""]
    return replacement if isinstance(replacement, str) else replacement(match)


def _cap(text: str) -> str:
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 1].rstrip() + "…"
    return text


def _one_pass(text: str) -> str:
    return _cap(_COMBINED.sub(_replace, text).strip())


def _fixed_point(text: str) -> str:
    # A replacement or the length cap can expose a new match (a cut token now
    # ending at a word boundary); iterate to the fixed point so the result is
    # stable when a record is sanitized again after a wire round trip.
    for _ in range(4):
        cleaned = _one_pass(text)
        if cleaned == text:
            return _clean(cleaned)
        text = cleaned
    return text


def sanitize_message(text: object) -> str:
    """Return ``text`` safe for a client: no traces, paths, secrets or media."""
    if type(text) is not str:
        # An exact str: a subclass may override slicing, stripping or equality.
        try:
            text = str.__str__(text if isinstance(text, str) else str(text))
        except Exception:
            return ""
    if text in _CLEAN:
        return text
    text = text[:_SCAN_LIMIT]
    if not _may_match(text):
        # No rule can match: the full scan would only strip and cap.
        return _clean(_cap(text.strip()))
    return _fixed_point(text)


def sanitize_parameter(parameter: object) -> str | None:
    """Return ``parameter`` if it is a plain field path, else ``None`` (§5)."""
    if isinstance(parameter, str) and _PARAMETER_RE.fullmatch(parameter):
        return parameter
    return None


def sanitize_request_id(request_id: object) -> str | None:
    """Return ``request_id`` if it is a safe, bounded token, else ``None``."""
    if isinstance(request_id, str) and _REQUEST_ID_RE.fullmatch(request_id):
        return request_id
    return None
