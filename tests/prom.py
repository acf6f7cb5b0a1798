"""Read Prometheus samples the way a scraper does: exposition text, parsed
with ``prometheus_client.parser``, from this process or a server's /metrics."""

from __future__ import annotations

import httpx
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition text, keyed by name and label set."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def local_text() -> str:
    return generate_latest(REGISTRY).decode()


def server_text(base_url: str) -> str:
    response = httpx.get(base_url + "/metrics", timeout=10)
    response.raise_for_status()
    return response.text


def value(text: str, name: str, **labels: str) -> float:
    """One sample's value; 0.0 when the series does not exist (yet)."""
    return samples(text).get((name, frozenset(labels.items())), 0.0)


def local(name: str, **labels: str) -> float:
    return value(local_text(), name, **labels)
