"""Public-text sanitization (docs/design.md §5): what may leave the server in an error.

Owns the rules that find what must not leave the server, and two uses of
them. ``sanitize_message`` turns arbitrary exception text into text safe to
show a client: it strips tracebacks and ``File "…", line N`` frames, replaces
filesystem paths, memory addresses, credentials, data URIs and long base64
runs, drops control characters, replaces lone surrogates (text that is not
Unicode) by U+FFFD and caps the length. The normalizer calls it once;
nothing else should need to. It must never raise and must be idempotent
(``sanitize(sanitize(x)) == sanitize(x)``), because records are re-checked
when they are read back from the wire. ``redact_credentials`` runs the
credential rules alone, for log lines, which keep their paths and tracebacks
(docs/design.md §10).

Credential shapes come from a maintained rule set, detect-secrets (PyPI,
pinned): its regex plugins and its list of secret names join our own rules
(``_rule_set``), loaded on first use (``warm_rule_set`` at startup).

All patterns live in one table and run as a single alternation, so a message
is scanned once however many rules there are; rules whose trigger substrings
do not occur in a message are left out of the alternation for it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
from collections.abc import Callable, Iterable

from vllm_omni.errors.text import make_safe

__all__ = [
    "MAX_MESSAGE_CHARS",
    "may_hold_credentials",
    "redact_credentials",
    "sanitize_message",
    "sanitize_parameter",
    "sanitize_request_id",
    "warm_rule_set",
]

MAX_MESSAGE_CHARS = 1024
# Longer input is cut before scanning: it bounds the work on hostile input,
# and nothing past this point could survive the final cap anyway.
_SCAN_LIMIT = 8 * MAX_MESSAGE_CHARS

_PARAMETER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\[\]-]{0,127}")
_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

# Names whose value is a credential. A name may carry a prefix
# (``HF_TOKEN``, ``aws_secret_access_key``, ``AccountKey``) and identifier
# words after it (``private_key_id``, ``password_hash``). The rule set adds
# detect-secrets' keyword list (see ``_rule_set``).
_SECRET_NAMES = (
    *("api[_-]?key", "access[_-]?key", "secret[_-]?key", "private[_-]?key", "key"),
    *("access[_-]?token", "auth[_-]?token", "refresh[_-]?token", "token"),
    *("password", "passwd", "passphrase", "pwd", "secret", "credentials?"),
    *("signature", "sig"),
)
# Names specific enough that ``name: value`` (a log or YAML line) is also an
# assignment; a bare ``key:`` or ``token:`` starts ordinary prose too often,
# so after those only a value that looks like a token goes (``_TOKEN_VALUE``).
_STRONG_NAMES = (
    *("api[_-]?key", "access[_-]?key", "secret[_-]?key", "private[_-]?key"),
    *("access[_-]?token", "auth[_-]?token", "refresh[_-]?token"),
    *("client[_-]?secret", "password", "passwd", "passphrase", "pwd", "secret"),
)
# Bounded, so a long identifier is scanned in linear time.
_NAME_SUFFIX = r"(?:[_-][A-Za-z0-9]{1,32}){0,3}"
_IDENT_START = r"(?<![A-Za-z0-9_.-])"
_IDENT_PREFIX = r"[A-Za-z0-9_-]*?"
_ASSIGNED_VALUE = r"(?:\"[^\"\n]*\"?|'[^'\n]*'?|[^\s,;&)\]}]+)"
# A value that looks like a credential rather than a word of prose, as the
# scanners' generic rules judge it (gitleaks' generic API key, detect-secrets'
# high-entropy strings) by its shape: a whole token of 16 to 256 token
# characters, starting with a letter or digit, one ``_``/``-``-separated run
# of which is 12 or more long and mixes letters with two digits or more (hex
# and base64 keys do; identifiers such as ``layer_12_attention`` or
# ``Qwen2VLForConditionalGeneration`` do not). A dot ends the shape: dotted
# names (``model.layers.31``) are prose, and JWTs have a rule of their own.
_TOKEN_VALUE = (
    r"[\"']?(?=[A-Za-z0-9])(?=[A-Za-z0-9+/=_-]{16,256}(?![A-Za-z0-9+/=_.~-]))"
    r"(?=(?:[A-Za-z0-9+/=]*[_-])*?(?=[A-Za-z0-9+/=]{12})"
    r"(?=[A-Za-z+/=]*[0-9][A-Za-z+/=]*[0-9])(?=[0-9+/=]*[A-Za-z]))"
    r"[A-Za-z0-9+/=_-]+[\"']?"
)
# A small integer is a count or an index (``max_token=5``, ``sort_key=3``),
# never a credential; a password-like name is redacted whatever its value.
_COUNT_VALUE = re.compile(r"-?[0-9]{1,6}")
# Whether the name's last word is a password's (``db_password``), not merely
# one of its words (``password_min_length=12`` is a setting).
_PASSWORD_NAME = re.compile(r"(?i)(?:pass|pwd|secret|contrase)[A-Za-zñÑ]*[\"' \t:=]*$")
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


def _keyword_token(match: re.Match[str]) -> str:
    return match.group("token_head") + "<redacted>"


def _auth_header(match: re.Match[str]) -> str:
    return match.group("auth_head") + "<redacted>"


Replacement = str | Callable[[re.Match[str]], str]
# (name, pattern, replacement). The replacement is a string or, for rules that
# keep part of the match, a function of the match.
Rule = tuple[str, str, Replacement]


def _one_of(names: tuple[str, ...]) -> str:
    """An alternation of ``names`` (each a regular expression starting with
    a letter), case ignored."""
    names = tuple(dict.fromkeys(names))
    alternation = "(?ai:" + "|".join(n for n in names if n.isascii()) + ")"
    others = [n for n in names if not n.isascii()]  # detect-secrets' contraseña
    if others:
        alternation += "|(?i:" + "|".join(others) + ")"
    # One class test per position before the alternation is tried: the
    # identifier prefix is lazy, so the names are tried at every character.
    first = sorted({case(n[0]) for n in names for case in (str.lower, str.upper)})
    return f"(?=[{''.join(first)}])(?:{alternation})"


def _name_rules(
    names: tuple[str, ...], strong: tuple[str, ...]
) -> tuple[Rule, Rule, Rule]:
    """The rules for a secret given by name; ``strong`` names are specific
    enough to be followed by a colon as well as by ``=``, the others by a
    colon only when the value looks like a token."""
    names_re, strong_re = _one_of(names), _one_of(strong)
    return (
        (
            # JSON or Python-dict field: "password": "x", 'api_key': 'y'.
            "quoted_field",
            rf"(?P<quoted_head>[\"']{_IDENT_PREFIX}(?:{names_re}){_NAME_SUFFIX}"
            r"[\"'][ \t]*:[ \t]*)(?:\"[^\"\n]*\"?|'[^'\n]*'?|[^\s,;)\]}]+)",
            _quoted_field,
        ),
        (
            # ``name=value`` for every secret name; ``name: value`` only for
            # names specific enough (``key:`` or ``token:`` starts prose too).
            "assignment",
            rf"(?P<assign_head>{_IDENT_START}{_IDENT_PREFIX}"
            rf"(?:(?:{strong_re}){_NAME_SUFFIX}(?![A-Za-z0-9])[ \t]*[=:]"
            rf"|(?:{names_re}){_NAME_SUFFIX}(?![A-Za-z0-9])[ \t]*=)[ \t]*)"
            rf"(?!<redacted>){_ASSIGNED_VALUE}",
            _assignment,
        ),
        (
            # ``token: 9f3a…`` in prose or a config dump: any secret name,
            # a colon, and a value shaped like a credential (listed after
            # ``assignment``, which takes the names it redacts whatever follows).
            "keyword_token",
            rf"(?P<token_head>{_IDENT_START}{_IDENT_PREFIX}(?:{names_re})"
            rf"{_NAME_SUFFIX}(?![A-Za-z0-9])[ \t]*:[ \t]*){_TOKEN_VALUE}",
            _keyword_token,
        ),
    )


# Vendor tokens by their published prefix: (prefix, what follows it). The
# rule's pattern and its triggers are both built from this table, so no
# trigger can skip a token the pattern matches (docs/design.md §5).
_VENDOR_PREFIXES: tuple[tuple[str, str], ...] = (
    # GitHub: classic tokens by kind, and fine-grained personal access tokens.
    *((f"gh{kind}_", r"[A-Za-z0-9]{20,}") for kind in "pousr"),
    ("github_pat_", r"[A-Za-z0-9_]{20,}"),
    ("glpat-", r"[A-Za-z0-9_-]{16,}"),
    *((f"xox{kind}-", r"[A-Za-z0-9-]{10,}") for kind in "abprs"),
    *(
        (f"{kind}k_{mode}_", r"[A-Za-z0-9]{10,}")
        for kind in "sr"
        for mode in ("live", "test")
    ),
    ("AIza", r"[0-9A-Za-z_-]{30,}"),
    ("ya29.", r"[A-Za-z0-9_.-]{6,}"),
    # Formats their providers publish that detect-secrets has no plugin for
    # (the provider-format corpus, tests/errors/provider_tokens.py, found them).
    ("xapp-", r"[0-9]-[A-Z0-9]{6,}-[0-9]{6,}-[a-f0-9]{32,}"),
    ("whsec_", r"[A-Za-z0-9+/=]{24,}"),
    ("npm_", r"[A-Za-z0-9]{36,}"),
    *((f"do{kind}_v1_", r"[a-f0-9]{64,}") for kind in "por"),
    *((f"shp{kind}_", r"[a-fA-F0-9]{32,}") for kind in ("at", "ca", "pa", "ss")),
    ("dapi", r"[a-f0-9]{32,}"),
    ("lin_api_", r"[A-Za-z0-9]{40,}"),
    ("PMAK-", r"[a-f0-9]{24}-[a-f0-9]{34,}"),
    ("glsa_", r"[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}"),
    ("glc_", r"[A-Za-z0-9+/]{32,}={0,2}"),
    ("r8_", r"[A-Za-z0-9]{37,}"),
    ("gsk_", r"[A-Za-z0-9]{52,}"),
    ("pplx-", r"[A-Za-z0-9]{48,}"),
)
_VENDOR_TOKEN = (
    r"\b(?:"
    + "|".join(re.escape(prefix) + body for prefix, body in _VENDOR_PREFIXES)
    + ")"
)

# Our own rules. Order matters where two rules could start at the same
# position: the first listed wins.
_RULES: tuple[Rule, ...] = (
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
    ("vendor_token", _VENDOR_TOKEN, "<redacted>"),
    *_name_rules(_SECRET_NAMES, _STRONG_NAMES),
    ("address_suffix", r" at 0x[0-9a-fA-F]+", ""),
    ("address", r"\b0x[0-9a-fA-F]{8,}\b", "<address>"),
    # A run of hex digits alone is a hash in prose (a checksum, a commit),
    # not media: it stays.
    (
        "base64_run",
        r"(?![0-9a-f]{64,}(?![A-Za-z0-9+/=])|[0-9A-F]{64,}(?![A-Za-z0-9+/=]))"
        r"[A-Za-z0-9+/]{64,}={0,2}",
        "<data>",
    ),
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


_CONTROL_RE = re.compile(_CONTROL)


@dataclasses.dataclass(frozen=True, slots=True)
class _AnyWord:
    """A trigger that occurs when the lower-cased text contains one of ``words``."""

    words: tuple[str, ...]


# Every match of the rules on a secret's name (matched ASCII
# case-insensitively) contains one of these ("contrase": detect-secrets'
# Spanish "contraseña").
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
        "contrase",
    )
)
_Simple = str | re.Pattern[str] | _AnyWord


@dataclasses.dataclass(frozen=True, slots=True)
class _All:
    """A trigger that occurs when every one of ``parts`` occurs: a plugin
    whose match holds a common keyword (``key``, ``token``) and a long run
    of token characters is triggered by both, not by either alone (a
    request id is such a run; most prose has such a word)."""

    parts: tuple[_Simple, ...]


Trigger = _Simple | _All
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
    "vendor_token": tuple(prefix for prefix, _ in _VENDOR_PREFIXES),
    "quoted_field": (_SECRET_NAME,),
    "assignment": (_SECRET_NAME,),
    "keyword_token": (_SECRET_NAME,),
    "address_suffix": ("0x",),
    "address": ("0x",),
    "base64_run": ("/", _BASE64_RUN_RE),
    "windows_path": (":\\",),
    "posix_path": ("/",),
    "control": (_CONTROL_RE,),
}

# -- the maintained rule set: detect-secrets ---------------------------------
#
# Credential shapes come from detect-secrets' plugins (PyPI, pinned), not from
# memory: every regex plugin's denylist becomes one rule of the alternation,
# placed after our own vendor rules, and the keyword plugin's list of secret
# names joins ours. Left out: the entropy plugins (a request id or a hash is
# not a credential, and must stay), the public-IP plugin (an address is not
# a credential), and the basic-auth plugin, whose match starts at ``://`` and
# would keep the user name that ``url_userinfo`` removes (the corpus test
# checks that rule covers every URL credential the plugin finds).
_SKIPPED_PLUGINS = frozenset(
    {
        "Base64HighEntropyString",
        "HexHighEntropyString",
        "IPPublicDetector",
        "BasicAuthDetector",
    }
)
# Triggers of each plugin's rule (see _TRIGGERS): a plugin not listed here
# (a new one after an upgrade) is triggered by its own patterns, which is
# exact but costs a scan of every message. Plugins whose secret is a long
# run of token characters after a keyword are triggered by the run and the
# keyword together (``_All``): either alone is common (the keywords ``key``,
# ``pass`` in prose; the run in every request id).
_LONG_TOKEN = re.compile(r"[\w/+-]{24}")
# The names before the secret in the keyword plugins' patterns (``pwd`` and
# ``password`` hold ``pw`` and ``pass``), matched case-insensitively.
_PLUGIN_KEY_NAME = _AnyWord(("key", "pw", "pass", "token"))
_PLUGIN_TRIGGERS: dict[str, tuple[Trigger, ...]] = {
    "ArtifactoryDetector": ("AKC", "AP"),
    "AWSKeyDetector": (
        "A3T",
        "ABIA",
        "ACCA",
        "AKIA",
        "ASIA",
        _All((_LONG_TOKEN, _AnyWord(("aws",)))),
    ),
    "AzureStorageKeyDetector": ("AccountKey=",),
    "CloudantDetector": (
        _All((_LONG_TOKEN, _PLUGIN_KEY_NAME)),
        _AnyWord(("cloudant",)),
    ),
    "DiscordBotTokenDetector": (
        # From its first dot on (a literal first is searched fast).
        _All((_LONG_TOKEN, re.compile(r"\.[\w-]{6}\."))),
    ),
    "GitHubTokenDetector": ("gh",),
    "GitLabTokenDetector": ("gl", "GR1348941"),
    "IbmCloudIamDetector": (_All((_LONG_TOKEN, _PLUGIN_KEY_NAME)),),
    "IbmCosHmacDetector": (_All((_LONG_TOKEN, _AnyWord(("secret",)))),),
    "JwtTokenDetector": ("eyJ",),
    "MailchimpDetector": ("-us",),
    "NpmDetector": ("_authToken",),
    "OpenAIDetector": ("T3BlbkFJ",),
    "PrivateKeyDetector": ("BEGIN ", "PuTTY-User-Key-File-2"),
    "PypiTokenDetector": ("pypi-",),
    "SendGridDetector": ("SG.",),
    "SlackDetector": (_AnyWord(("xox", "hooks.slack.com")),),
    "SoftlayerDetector": (
        _All((_LONG_TOKEN, _PLUGIN_KEY_NAME)),
        _AnyWord(("softlayer",)),
    ),
    "SquareOAuthDetector": ("sq0csp-",),
    "StripeDetector": ("k_live_",),
    "TelegramBotTokenDetector": (_All((_LONG_TOKEN, re.compile(r":[\w-]{35}"))),),
    "TwilioKeyDetector": (_All((_LONG_TOKEN, re.compile(r"(?:AC|SK)[a-z0-9]{32}"))),),
}
# Around a plugin's secret, what belongs to its context, not to it.
_DELIMITERS = frozenset(" \t\r\n\v\f\"'`=:@[]()")


def _inline(pattern: re.Pattern[str]) -> str:
    """``pattern`` as a part of a larger one, its flags scoped to it."""
    flags = "".join(
        letter
        for flag, letter in (
            (re.IGNORECASE, "i"),
            (re.MULTILINE, "m"),
            (re.VERBOSE, "x"),
        )
        if pattern.flags & flag
    )
    return f"(?{flags}:{pattern.pattern})" if flags else f"(?:{pattern.pattern})"


def _plugin_replacement(name: str, groups: int) -> Callable[[re.Match[str]], str]:
    """Redact what a plugin reports: its first capture group (the secret, in
    the plugins whose pattern also matches a keyword) to the end of the
    match, or the whole match; the delimiters around it stay."""

    def replace(match: re.Match[str]) -> str:
        outer = match.re.groupindex[name]
        start, end = match.span(outer)
        begin = start
        for group in range(outer + 1, outer + 1 + groups):
            if match.start(group) >= 0 and match.end(group) > match.start(group):
                begin = match.start(group)
                break
        text = match.string
        while begin < end and text[begin] in _DELIMITERS:
            begin += 1
        stop = end
        while stop > begin and text[stop - 1] in _DELIMITERS:
            stop -= 1
        if begin == stop:
            return text[start:end]
        return text[start:begin] + "<redacted>" + text[stop:end]

    return replace


@dataclasses.dataclass(frozen=True, slots=True)
class _RuleSet:
    """What the maintained rule set adds to our rules."""

    names: tuple[str, ...]
    rules: tuple[Rule, ...]
    triggers: dict[str, tuple[Trigger, ...]]


@functools.cache
def _rule_set() -> _RuleSet:
    # Imported on first use: detect-secrets (and ``requests`` with it) costs
    # a process that has not loaded them about half a second, which the
    # checks before a server starts, and the audit, must not pay.
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import RegexBasedDetector
    from detect_secrets.plugins.keyword import DENYLIST

    rules: list[Rule] = []
    triggers: dict[str, tuple[Trigger, ...]] = {}
    plugins = get_mapping_from_secret_type_to_class().values()
    for plugin in sorted(plugins, key=lambda cls: cls.__name__):
        if not issubclass(plugin, RegexBasedDetector):
            continue
        if plugin.__name__ in _SKIPPED_PLUGINS:
            continue
        patterns = tuple(plugin().denylist)
        name = f"ds_{plugin.__name__}"
        pattern = "|".join(_inline(p) for p in patterns)
        groups = sum(p.groups for p in patterns)
        rules.append((name, pattern, _plugin_replacement(name, groups)))
        triggers[name] = _PLUGIN_TRIGGERS.get(plugin.__name__, (re.compile(pattern),))
    return _RuleSet(tuple(DENYLIST), tuple(rules), triggers)


@dataclasses.dataclass(frozen=True, eq=False)
class _Table:
    """The rules in table order, with their triggers."""

    rules: tuple[Rule, ...]
    triggers: dict[str, tuple[Trigger, ...]]

    @functools.cached_property
    def patterns(self) -> dict[str, str]:
        return {name: pattern for name, pattern, _ in self.rules}

    @functools.cached_property
    def replacements(self) -> dict[str, Replacement]:
        return {name: replacement for name, _, replacement in self.rules}

    @functools.cached_property
    def triggered(self) -> _Triggers:
        return _Triggers(self.triggers)

    @functools.cached_property
    def triggered_credentials(self) -> _Triggers:
        """The triggers of ``credentials`` alone (a log line is scanned for
        these: a path's ``/`` or a base64 run triggers nothing there)."""
        wanted = set(self.credentials)
        return _Triggers({n: t for n, t in self.triggers.items() if n in wanted})

    @functools.cached_property
    def every(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.rules)

    @functools.cached_property
    def credentials(self) -> tuple[str, ...]:
        """The rules that find a credential. Log lines get these and only
        these: paths, tracebacks and addresses are what logs are for."""
        return tuple(
            name
            for name in self.every
            if name.startswith("ds_") or name in _CREDENTIAL_RULES
        )


_CREDENTIAL_RULES = frozenset(
    {
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
        "keyword_token",
    }
)


@functools.cache
def _table(rule_set: bool = True) -> _Table:
    """Our rules, with the maintained rule set (``rule_set=False``: ours
    alone, the table before it was added; the benchmark compares both)."""
    if not rule_set:
        return _Table(_RULES, _TRIGGERS)
    added = _rule_set()
    names = (*_SECRET_NAMES, *added.names)
    strong = (*_STRONG_NAMES, *added.names)
    rules: list[Rule] = []
    for rule in _RULES:
        if rule[0] == "quoted_field":
            rules.extend(_name_rules(names, strong))
        elif rule[0] not in ("assignment", "keyword_token"):
            rules.append(rule)
        if rule[0] == "vendor_token":
            rules.extend(added.rules)
    return _Table(tuple(rules), {**_TRIGGERS, **added.triggers})


def _any_of(literals: Iterable[str]) -> str:
    """A pattern that finds whether any of ``literals`` occurs, as a trie:
    the regex engine tries one branch per character instead of every
    literal at every position (the vendor prefixes alone are some thirty)."""
    trie: dict[str, dict] = {}
    for literal in literals:
        node = trie
        for char in literal:
            node = node.setdefault(char, {})
        node[""] = {}

    def branches(node: dict[str, dict]) -> str:
        if "" in node:  # a whole literal: whatever follows it is not needed
            return ""
        parts = [
            re.escape(char) + branches(child) for char, child in sorted(node.items())
        ]
        return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"

    return branches(trie)


class _Triggers:
    """Which rules a text can trigger, with each distinct trigger tested once
    and, for most texts, none tested one by one: one scan for any substring
    and one for any word tells that nothing occurs."""

    def __init__(self, triggers: dict[str, tuple[Trigger, ...]]) -> None:
        substrings: dict[str, set[str]] = {}
        words: dict[str, set[str]] = {}
        patterns: dict[re.Pattern[str], set[str]] = {}
        every: dict[_All, set[str]] = {}
        for name, of_rule in triggers.items():
            for trigger in of_rule:
                if isinstance(trigger, _All):
                    every.setdefault(trigger, set()).add(name)
                elif isinstance(trigger, str):
                    substrings.setdefault(trigger, set()).add(name)
                elif isinstance(trigger, _AnyWord):
                    for word in trigger.words:
                        words.setdefault(word, set()).add(name)
                else:
                    patterns.setdefault(trigger, set()).add(name)
        self._substrings = [(s, frozenset(n)) for s, n in substrings.items()]
        self._words = [(w, frozenset(n)) for w, n in words.items()]
        self._patterns = [(p, frozenset(n)) for p, n in patterns.items()]
        # Each conjunction's parts as (index of the part among all of them,
        # pattern, whether on the lower-cased text).
        index: dict[_Simple, int] = {}
        self._every = [
            (
                tuple(
                    (index.setdefault(part, len(index)), *_test(part))
                    for part in t.parts
                ),
                frozenset(n),
            )
            for t, n in every.items()
        ]
        self._parts = len(index)
        self._any_substring = re.compile(_any_of(substrings))
        self._any_word = re.compile(_any_of(words))

    def rules(self, text: str) -> set[str]:
        found: set[str] = set()
        if self._any_substring.search(text):
            for substring, names in self._substrings:
                if substring in text:
                    found |= names
        lowered = text.lower()
        if self._any_word.search(lowered):
            for word, names in self._words:
                if word in lowered:
                    found |= names
        for pattern, names in self._patterns:
            if not names <= found and pattern.search(text):
                found |= names
        if self._every:
            # Each part tested once per text; the parts the conjunctions
            # share come first, so most texts are done after one test.
            seen: list[bool | None] = [None] * self._parts
            for parts, names in self._every:
                if names <= found:
                    continue
                for part, pattern, on_lowered in parts:
                    occurs = seen[part]
                    if occurs is None:
                        subject = lowered if on_lowered else text
                        occurs = seen[part] = pattern.search(subject) is not None
                    if not occurs:
                        break
                else:
                    found |= names
        return found


def _test(part: _Simple) -> tuple[re.Pattern[str], bool]:
    """``part`` as a pattern to search for, and whether in the lower-cased
    text (an ``_AnyWord``)."""
    if isinstance(part, str):
        return re.compile(re.escape(part)), False
    if isinstance(part, _AnyWord):
        return re.compile(_any_of(part.words)), True
    return part, False


def _active_rules(
    text: str, triggers: _Triggers, among: tuple[str, ...]
) -> tuple[str, ...]:
    """The rules of ``among`` that can match ``text``, in table order
    (``triggers``: those of ``among``, or of a set that holds them)."""
    found = triggers.rules(text)
    if not found:
        return ()
    return tuple(name for name in among if name in found)


@functools.lru_cache(maxsize=256)
def _alternation(table: _Table, names: tuple[str, ...]) -> re.Pattern[str]:
    # One scan per message however many rules apply; the first rule listed
    # wins where two could start at the same position.
    return re.compile("|".join(f"(?P<{name}>{table.patterns[name]})" for name in names))


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


def _substitute(table: _Table, names: tuple[str, ...], text: str) -> str:
    replacements = table.replacements

    def replace(match: re.Match[str]) -> str:
        replacement = replacements[match.lastgroup or ""]
        return replacement if isinstance(replacement, str) else replacement(match)

    return _alternation(table, names).sub(replace, text)


def _cap(text: str) -> str:
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 1].rstrip() + "…"
    return text


def _one_pass(text: str, table: _Table, *, every_rule: bool) -> str:
    names = (
        table.every if every_rule else _active_rules(text, table.triggered, table.every)
    )
    if names:
        text = _substitute(table, names, text)
    return _cap(text.strip())


def _fixed_point(
    text: str, *, every_rule: bool = False, table: _Table | None = None
) -> str:
    # A replacement or the length cap can expose a new match (a cut token now
    # ending at a word boundary); iterate to the fixed point so the result is
    # stable when a record is sanitized again after a wire round trip.
    # ``every_rule`` runs the whole table, skipping no rule by its triggers
    # (the tests check that both agree).
    table = _table() if table is None else table
    for _ in range(4):
        cleaned = _one_pass(text, table, every_rule=every_rule)
        if cleaned == text:
            return _clean(cleaned) if table is _table() else cleaned
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
    if text in _NO_CREDENTIALS:
        return text
    safe = make_safe(text)
    table = _table()
    names = _active_rules(safe, table.triggered_credentials, table.credentials)
    if names:
        return _substitute(table, names, safe)
    if safe is text:
        _remember_clean(text)
    return safe


def may_hold_credentials(text: str) -> bool:
    """Whether ``redact_credentials`` could change ``text``. ``False`` says
    more: it changes no part of ``text`` either. A credential rule runs only
    where one of its triggers occurs, and every trigger that occurs in a
    part of a text occurs in the text: substrings, words, and patterns
    without anchors, boundaries or lookarounds (the tests check the table
    for these)."""
    if text in _NO_CREDENTIALS:
        return False
    if make_safe(text) is not text:
        return True
    table = _table()
    if _active_rules(text, table.triggered_credentials, table.credentials):
        return True
    _remember_clean(text)
    return False


# Short texts in which no credential rule can match: a log line's recurring
# arguments (a method, a path, a status phrase) are looked up, not scanned,
# and so is a line scanned once already (``logs`` checks a record's line when
# it is made, and redacts it again when a handler renders it).
_NO_CREDENTIALS: dict[str, None] = {}
_NO_CREDENTIALS_CHARS = 256


def _remember_clean(text: str) -> None:
    if len(text) <= _NO_CREDENTIALS_CHARS:
        if len(_NO_CREDENTIALS) >= _CLEAN_MAX:
            _NO_CREDENTIALS.clear()
        _NO_CREDENTIALS[text] = None


def warm_rule_set() -> threading.Thread:
    """Load the rule set in a daemon thread (a server or stage starting up),
    so that no request waits for it."""
    thread = threading.Thread(target=_table, name="vllm-omni-rules", daemon=True)
    thread.start()
    return thread


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
