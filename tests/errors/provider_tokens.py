"""A secrets corpus the sanitizer's rules did not produce (issue 40).

Shared by ``test_provider_tokens.py`` (recall must be 100 %) and
``benchmarks/bench_sanitize.py`` (recall on it, printed). The rule-derived
corpus (``secret_rules.py``) is drawn from the same detect-secrets patterns
the sanitizer compiles, so it cannot see a provider those patterns lack, nor
a prefilter trigger that skips a rule. This one is drawn from each
provider's *published* token format, written here from the provider's own
documentation of its keys, and from credentials as they appear labelled in
configuration dumps and exception messages (``token: <hex>``); none of it
comes from ``vllm_omni.errors.sanitize`` or from detect-secrets.

Draws are derandomized (hypothesis ``from_regex``), so the corpus is the
same on every run; each token is set in realistic surroundings, and each
case names the token that must be gone after sanitizing.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

__all__ = ["LABELLED_FORMS", "PROVIDER_FORMATS", "TokenCase", "provider_corpus"]

# (provider and kind, the token format the provider documents).
PROVIDER_FORMATS: tuple[tuple[str, str], ...] = (
    ("GitHub classic personal access token", r"ghp_[A-Za-z0-9]{36}"),
    ("GitHub OAuth access token", r"gho_[A-Za-z0-9]{36}"),
    ("GitHub user-to-server token", r"ghu_[A-Za-z0-9]{36}"),
    ("GitHub server-to-server token", r"ghs_[A-Za-z0-9]{36}"),
    ("GitHub refresh token", r"ghr_[A-Za-z0-9]{36}"),
    (
        "GitHub fine-grained personal access token",
        r"github_pat_[A-Za-z0-9]{22}_[A-Za-z0-9]{59}",
    ),
    ("GitLab personal access token", r"glpat-[A-Za-z0-9_-]{20}"),
    ("GitLab deploy token", r"gldt-[A-Za-z0-9_-]{20}"),
    ("GitLab runner authentication token", r"glrt-[A-Za-z0-9_-]{20}"),
    ("Slack bot token", r"xoxb-[0-9]{10,13}-[0-9]{10,13}-[A-Za-z0-9]{24}"),
    ("Slack user token", r"xoxp-[0-9]{10,13}-[0-9]{10,13}-[0-9]{10,13}-[a-f0-9]{32}"),
    ("Slack app-level token", r"xapp-1-[A-Z0-9]{11}-[0-9]{13}-[a-f0-9]{64}"),
    ("Stripe secret key", r"sk_live_[A-Za-z0-9]{24,99}"),
    ("Stripe restricted key", r"rk_live_[A-Za-z0-9]{24,99}"),
    ("Stripe test secret key", r"sk_test_[A-Za-z0-9]{24,99}"),
    ("Stripe webhook signing secret", r"whsec_[A-Za-z0-9]{32}"),
    ("OpenAI project key", r"sk-proj-[A-Za-z0-9_-]{80,156}"),
    ("OpenAI service account key", r"sk-svcacct-[A-Za-z0-9_-]{80,156}"),
    ("OpenAI admin key", r"sk-admin-[A-Za-z0-9_-]{80,156}"),
    ("Anthropic API key", r"sk-ant-api03-[A-Za-z0-9_-]{93}AA"),
    ("Hugging Face user access token", r"hf_[A-Za-z0-9]{34}"),
    ("AWS access key id", r"AKIA[A-Z2-7]{16}"),
    ("AWS temporary access key id", r"ASIA[A-Z2-7]{16}"),
    ("Google API key", r"AIza[0-9A-Za-z_-]{35}"),
    ("Google OAuth access token", r"ya29\.[0-9A-Za-z_-]{60,200}"),
    ("npm access token", r"npm_[A-Za-z0-9]{36}"),
    ("PyPI API token", r"pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{100,200}"),
    ("SendGrid API key", r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}"),
    ("DigitalOcean personal access token", r"dop_v1_[a-f0-9]{64}"),
    ("DigitalOcean OAuth token", r"doo_v1_[a-f0-9]{64}"),
    ("Shopify admin API access token", r"shpat_[a-fA-F0-9]{32}"),
    ("Shopify shared secret", r"shpss_[a-fA-F0-9]{32}"),
    ("Databricks personal access token", r"dapi[a-f0-9]{32}"),
    ("Linear API key", r"lin_api_[A-Za-z0-9]{40}"),
    ("Postman API key", r"PMAK-[a-f0-9]{24}-[a-f0-9]{34}"),
    ("Grafana service account token", r"glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}"),
    ("Replicate API token", r"r8_[A-Za-z0-9]{37}"),
    ("Groq API key", r"gsk_[A-Za-z0-9]{52}"),
    ("Perplexity API key", r"pplx-[A-Za-z0-9]{48}"),
)

# A credential after a weak name, as configuration dumps and exception
# messages print it: (form, alphabet, length). The values are random over
# the alphabet, as a key generator makes them (``secrets.token_hex``).
_HEX = "0123456789abcdef"
LABELLED_FORMS: tuple[tuple[str, str, int], ...] = (
    ("token: {}", _HEX, 16),
    ("token: {}", _HEX, 32),
    ("token: {}", _HEX, 64),
    ("key: {}", _HEX, 32),
    ("api token: {}", _HEX.upper(), 24),
    ("signing key: {}", _HEX, 40),
    ("X-Auth-Token: {}", _HEX, 20),
    ("session key: '{}'", _HEX, 16),
)

CONTEXTS = (
    "{}",
    "upstream refused the request ({}): 401 Unauthorized",
    "httpx.HTTPStatusError: Client error '403 Forbidden' with {}",
    "RuntimeError: could not load the stage config {} from the environment",
    "invalid credentials {}, check the deployment secrets",
)


@dataclass(frozen=True)
class TokenCase:
    """One text; ``token`` must be gone after sanitizing."""

    source: str
    text: str
    token: str


def _draws(pattern: str, count: int) -> list[str]:
    drawn: list[str] = []

    @settings(
        derandomize=True,
        database=None,
        max_examples=count,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.from_regex(pattern, fullmatch=True))
    def draw(text: str) -> None:
        drawn.append(text)

    draw()
    return drawn


@functools.cache
def provider_corpus(per_format: int = 6) -> tuple[TokenCase, ...]:
    """``per_format`` draws of every provider format and labelled form, each
    in a rotating surrounding text."""
    cases: list[TokenCase] = []
    for provider, pattern in PROVIDER_FORMATS:
        for index, token in enumerate(_draws(pattern, per_format)):
            text = CONTEXTS[index % len(CONTEXTS)].format(token)
            cases.append(TokenCase(provider, text, token))
    generator = random.Random(40)
    for form, alphabet, length in LABELLED_FORMS:
        for index in range(per_format):
            value = "".join(generator.choices(alphabet, k=length))
            text = CONTEXTS[index % len(CONTEXTS)].format(form.format(value))
            cases.append(TokenCase(form.format("<value>"), text, value))
    return tuple(cases)
