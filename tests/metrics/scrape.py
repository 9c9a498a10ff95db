"""Scrape a ferrymq metrics endpoint and index its samples (tests' helper)."""

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape_text(address: str) -> str:
    """The exposition text at `http://address/metrics`."""
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.get(f"http://{address}/metrics")
    response.raise_for_status()
    return response.text


async def scrape(address: str) -> Samples:
    """Every sample at `http://address/metrics`: (name, labels) -> value."""
    samples: Samples = {}
    for family in text_string_to_metric_families(await scrape_text(address)):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    wanted = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and wanted <= ls]
    assert found, f"no sample {name} {labels}"
    return sum(found)
