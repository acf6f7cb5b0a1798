"""Public-text sanitization (DESIGN §5): what may leave the server in an error.

Owns one job: turn arbitrary exception text into text safe to show a client.
It strips tracebacks and ``File "…", line N`` frames, replaces filesystem
paths, memory addresses, credentials, data URIs and long base64 runs, drops
control characters, replaces lone surrogates (text that is not Unicode) by
U+FFFD and caps the length. The normalizer calls it once; nothing
else should need to. It must never raise and must be idempotent
(``sanitize(sanitize(x)) == sanitize(x)``), because records are re-checked
when they are read back from the wire. ``redact_credentials`` runs the
credential rules of the same table alone, for log lines, which keep their
paths and tracebacks.

All patterns live in one table and run as a single alternation, so a message
is scanned once however many rules there are; rules whose trigger substrings
do not occur in a message are left out of the alternation for it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable

from vllm_omni.errors.text import make_safe

__all__ = [
    "MAX_MESSAGE_CHARS",
    "redact_credentials",
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

# Names whose value is a credential. A name may carry a prefix
# (``HF_TOKEN``, ``aws_secret_access_key``, ``AccountKey``).
_SECRET_NAMES = (
    r"api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key|key"
    r"|access[_-]?token|auth[_-]?token|refresh[_-]?token|token"
    r"|password|passwd|passphrase|pwd|secret|credentials?|signature|sig"
)
# Names specific enough that ``name: value`` (a log or YAML line) is also an
# assignment; a bare ``key:`` or ``token:`` starts ordinary prose too often.
_STRONG_NAMES = (
    r"api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key"
    r"|access[_-]?token|auth[_-]?token|refresh[_-]?token|client[_-]?secret"
    r"|password|passwd|passphrase|pwd|secret"
)
_IDENT_START = r"(?<![A-Za-z0-9_.-])"
_IDENT_PREFIX = r"[A-Za-z0-9_-]*?"
_ASSIGNED_VALUE = r"(?:\"[^\"\n]*\"?|'[^'\n]*'?|[^\s,;&)\]}]+)"
# A small integer is a count or an index (``max_token=5``, ``sort_key=3``),
# never a credential; a password-like name is redacted whatever its value.
_COUNT_VALUE = re.compile(r"-?[0-9]{1,6}")
_PASSWORD_NAME = re.compile(r"(?ai)pass|pwd|secret")
# A plain word after an auth scheme or a key prefix is prose ("Bearer tokens
# are not accepted", "sk-learn", "hf_transfer"), not a credential: credentials
# carry digits, mixed case or punctuation, or are long.
_WORD = r"(?:[a-z]{1,15}|[A-Z][a-z]{1,15})(?![A-Za-z0-9._~+/=-])"

_CONTROL = r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]"


def _assignment(match: re.Match[str]) -> str:
    head = match.group("assign_head")
    value = match.group(0)[len(head) :].strip("\"'")
    if _COUNT_VALUE.fullmatch(value) and not _PASSWORD_NAME.search(head):
        return match.group(0)
    name = head.rstrip()
    if name.endswith("="):
        return name[:-1].rstrip() + "=<redacted>"
    return head + "<redacted>"


def _quoted_field(match: re.Match[str]) -> str:
    head = match.group("quoted_head")
    value = match.group(0)[len(head) :].strip("\"'")
    if _COUNT_VALUE.fullmatch(value) and not _PASSWORD_NAME.search(head):
        return match.group(0)
    return head + '"<redacted>"'


def _auth_header(match: re.Match[str]) -> str:
    return match.group("auth_head") + "<redacted>"


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
        r"(?s:-----BEGIN [A-Z ]*PRIVATE KEY(?: BLOCK)?-----.*?"
        r"(?:-----END [A-Z ]*PRIVATE KEY(?: BLOCK)?-----|\Z))",
        "<redacted>",
    ),
    (
        "data_uri",
        r"\bdata:(?:[\w.+-]+/[\w.+-]+)?(?:;[\w.+-]+(?:=[\w.+-]+)?)*,[^\s\"'<>)\]]*",
        "<data>",
    ),
    ("file_uri", r"\b(?:file|ipc)://[^\s\"'<>,)]*", "<path>"),
    ("url_userinfo", r"(?<=://)[^/\s:@]*:[^/\s@]*@", "<redacted>@"),
    (
        # A header line: the whole value goes, whatever the scheme.
        "auth_header",
        r"(?P<auth_head>(?ai:\b(?:proxy-)?authorization|\bx-api-key|\bcookie"
        r"|\bset-cookie)[ \t]*[:=][ \t]*(?:(?ai:bearer|basic|token|digest)[ \t]+)?)"
        r"[^\s,;)'\"]+(?:;[ \t]*[^\s,;)'\"]+)*",
        _auth_header,
    ),
    (
        "auth_scheme",
        rf"\b(?:[Bb]earer|[Bb]asic)[ \t]+(?!{_WORD})[A-Za-z0-9._~+/=-]+",
        lambda m: m.group(0).split(None, 1)[0] + " <redacted>",
    ),
    (
        "jwt",
        r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{2,}(?:\.[A-Za-z0-9_-]*)?",
        "<redacted>",
    ),
    ("openai_key", rf"\bsk-(?!{_WORD})[A-Za-z0-9_-]{{3,}}", "<redacted>"),
    ("hf_token", rf"\bhf_(?!{_WORD})[A-Za-z0-9]{{6,}}", "<redacted>"),
    ("aws_key", r"\b(?:AKIA|ASIA)[0-9A-Z]{12,}", "<redacted>"),
    (
        # GitHub, GitLab, Slack, Stripe, Google API keys and OAuth tokens.
        "vendor_token",
        r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
        r"|glpat-[A-Za-z0-9_-]{16,}|xox[abprs]-[A-Za-z0-9-]{10,}"
        r"|[sr]k_(?:live|test)_[A-Za-z0-9]{10,}|AIza[0-9A-Za-z_-]{30,}"
        r"|ya29\.[A-Za-z0-9_.-]{6,})",
        "<redacted>",
    ),
    (
        # JSON or Python-dict field: "password": "x", 'api_key': 'y'.
        "quoted_field",
        rf"(?P<quoted_head>[\"']{_IDENT_PREFIX}(?ai:{_SECRET_NAMES})[\"'][ \t]*:[ \t]*)"
        r"(?:\"[^\"\n]*\"?|'[^'\n]*'?|[^\s,;)\]}]+)",
        _quoted_field,
    ),
    (
        # ``name=value`` for every secret name; ``name: value`` only for names
        # specific enough (a bare ``key:`` or ``token:`` starts prose too).
        "assignment",
        rf"(?P<assign_head>{_IDENT_START}{_IDENT_PREFIX}"
        rf"(?:(?ai:{_STRONG_NAMES})(?![A-Za-z0-9])[ \t]*[=:]"
        rf"|(?ai:{_SECRET_NAMES})(?![A-Za-z0-9])[ \t]*=)[ \t]*)"
        rf"(?!<redacted>){_ASSIGNED_VALUE}",
        _assignment,
    ),
    ("address_suffix", r" at 0x[0-9a-fA-F]+", ""),
    ("address", r"\b0x[0-9a-fA-F]{8,}\b", "<address>"),
    ("base64_run", r"[A-Za-z0-9+/]{64,}={0,2}", "<data>"),
    ("windows_path", r"\b[A-Za-z]:\\[^\s\"'<>|,)]*", "<path>"),
    (
        # API routes (``/v1/chat/completions``) are not files: a path whose
        # first segment is a version and that has no extension stays.
        "posix_path",
        r"(?<![\w:/.~<-])(?!/v[0-9]+(?:/[\w{}-]+)+(?![\w./@+-]))"
        r"(?:~|\.{1,2})?/[\w.@+-]+(?:/[\w.@+-]*)+"
        r"|(?<![\w:/.~<-])(?:~|\.{1,2})/[\w.@+-]+"
        r"|(?<![\w:/.~<-])/[\w@+-]+\.\w+",
        "<path>",
    ),
    ("control", _CONTROL, ""),
)


_REPLACEMENTS = {name: replacement for name, _, replacement in _RULES}
_PATTERNS = {name: pattern for name, pattern, _ in _RULES}

_CONTROL_RE = re.compile(_CONTROL)


@dataclasses.dataclass(frozen=True, slots=True)
class _AnyWord:
    """A trigger that occurs when the lower-cased text contains one of ``words``."""

    words: tuple[str, ...]


# Every match of the rules on a secret's name (matched ASCII
# case-insensitively) contains one of these.
_SECRET_NAME = _AnyWord(
    (
        "key",
        "token",
        "pass",
        "pwd",
        "secret",
        "credential",
        "sig",
        "authorization",
        "cookie",
    )
)
Trigger = str | re.Pattern[str] | _AnyWord
# A base64 run without a "/" (runs with one are triggered by "/").
_BASE64_RUN_RE = re.compile(r"[A-Za-z0-9+]{64}")

# For each rule, substrings (or patterns) of which every one of its matches
# contains one. A rule none of whose triggers occurs in a text cannot match
# it, so it is left out of the alternation compiled for that text: results
# are exactly those of the full table, and most messages (no trigger at all)
# only get stripped and capped.
_TRIGGERS: dict[str, tuple[Trigger, ...]] = {
    "traceback": ("Traceback",),
    "frame": ('File "',),
    "private_key": ("-----BEGIN ",),
    "data_uri": ("data:",),
    "file_uri": ("://",),
    "url_userinfo": ("://",),
    "auth_header": (_SECRET_NAME,),
    "auth_scheme": ("earer", "asic"),
    "jwt": ("eyJ",),
    "openai_key": ("sk-",),
    "hf_token": ("hf_",),
    "aws_key": ("AKIA", "ASIA"),
    "vendor_token": ("gh", "k_live_", "k_test_", "glpat-", "xox", "AIza", "ya29."),
    "quoted_field": (_SECRET_NAME,),
    "assignment": (_SECRET_NAME,),
    "address_suffix": ("0x",),
    "address": ("0x",),
    "base64_run": ("/", _BASE64_RUN_RE),
    "windows_path": (":\\",),
    "posix_path": ("/",),
    "control": (_CONTROL_RE,),
}


def _occurs(trigger: Trigger, text: str) -> bool:
    if isinstance(trigger, str):
        return trigger in text
    if isinstance(trigger, _AnyWord):
        lowered = text.lower()
        return any(word in lowered for word in trigger.words)
    return trigger.search(text) is not None


def _active_rules(text: str, among: tuple[str, ...]) -> tuple[str, ...]:
    """The rules of ``among`` that can match ``text``, in table order."""
    seen: dict[Trigger, bool] = {}
    names = []
    for name in among:
        for trigger in _TRIGGERS[name]:
            occurs = seen.get(trigger)
            if occurs is None:
                occurs = seen[trigger] = _occurs(trigger, text)
            if occurs:
                names.append(name)
                break
    return tuple(names)


@functools.lru_cache(maxsize=256)
def _alternation(names: tuple[str, ...]) -> re.Pattern[str]:
    # One scan per message however many rules apply; the first rule listed
    # wins where two could start at the same position.
    return re.compile("|".join(f"(?P<{name}>{_PATTERNS[name]})" for name in names))


_ALL_RULES = tuple(_PATTERNS)
# The rules that find a credential. Log lines get these and only these:
# paths, tracebacks and addresses are what logs are for (DESIGN §10).
_CREDENTIAL_RULES = tuple(
    name
    for name in _ALL_RULES
    if name
    in {
        "private_key",
        "url_userinfo",
        "auth_header",
        "auth_scheme",
        "jwt",
        "openai_key",
        "hf_token",
        "aws_key",
        "vendor_token",
        "quoted_field",
        "assignment",
    }
)

# Recent results that are fixed points (never raw input), so a hit returns
# exactly what a full scan would. It turns the record's re-check of a message
# it was just given, and repeated messages (a storm of 503s), into a lookup.
_CLEAN: dict[str, None] = {}
_CLEAN_MAX = 1024


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


def _one_pass(text: str, *, every_rule: bool) -> str:
    names = _ALL_RULES if every_rule else _active_rules(text, _ALL_RULES)
    if names:
        text = _alternation(names).sub(_replace, text)
    return _cap(text.strip())


def _fixed_point(text: str, *, every_rule: bool = False) -> str:
    # A replacement or the length cap can expose a new match (a cut token now
    # ending at a word boundary); iterate to the fixed point so the result is
    # stable when a record is sanitized again after a wire round trip.
    # ``every_rule`` runs the whole table, skipping no rule by its triggers
    # (the tests check that both agree).
    for _ in range(4):
        cleaned = _one_pass(text, every_rule=every_rule)
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
    # A lone surrogate (client text quoted in a message) would make every
    # encoder downstream raise: JSON bodies, WebSocket frames, SQLite, logs.
    return _fixed_point(make_safe(text[:_SCAN_LIMIT]))


def redact_credentials(text: str) -> str:
    """``text`` with every credential replaced by ``<redacted>``, by the same
    rules ``sanitize_message`` applies, and lone surrogates by U+FFFD;
    everything else (paths, tracebacks, request ids) is left as it is.

    For log lines: ``vllm_omni.errors.logs`` passes every line through it.
    """
    text = make_safe(text)
    names = _active_rules(text, _CREDENTIAL_RULES)
    return _alternation(names).sub(_replace, text) if names else text


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
