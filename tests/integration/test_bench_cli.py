"""`ferry bench produce` against an in-process cluster: a topic without a route stops the run."""

import asyncio

from click.testing import CliRunner

from ferrymq.cli.bench import bench_produce
from ferrymq.testing import LocalCluster


async def test_bench_produce_stops_at_the_first_no_route_error(cluster: LocalCluster) -> None:
    result = await asyncio.to_thread(
        CliRunner().invoke,
        bench_produce,
        ["--namesrv", cluster.namesrv_addr, "--topic", "NoSuchTopic", "--count", "5000", "--json"],
    )
    assert result.exit_code == 1, result.output
    assert "stopped at the first send error: no route for topic 'NoSuchTopic'" in result.output
    assert '"errors": 1' in result.output  # the first error stopped it: 4999 were never sent
