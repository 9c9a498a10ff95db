"""The `ferry` command against real server processes: admin, produce, consume, bench, bad usage."""

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .procs import Server, start

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    workdir = tmp_path_factory.mktemp("cli")
    namesrv = start(["namesrv", "--listen", "127.0.0.1:0"], workdir, "namesrv")
    broker = start(
        [
            "broker",
            "--listen",
            "127.0.0.1:0",
            "--namesrv",
            namesrv.addr,
            "--store-dir",
            str(workdir / "store"),
        ],
        workdir,
        "broker",
    )
    yield namesrv, broker
    broker.stop()
    namesrv.stop()


def ferry(
    *args: str, stdin: str = "", namesrv: Server | None = None
) -> subprocess.CompletedProcess[str]:
    env_args = ["--namesrv", namesrv.addr] if namesrv else []
    command = [sys.executable, "-m", "ferrymq.cmd.ferry", *args]
    if env_args and args[0] == "admin":
        command = [sys.executable, "-m", "ferrymq.cmd.ferry", "admin", *env_args, *args[1:]]
    elif env_args:
        command += env_args
    return subprocess.run(
        command, input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def test_admin_produce_consume_and_lookups(servers: tuple[Server, Server]) -> None:
    namesrv, _ = servers
    created = ferry("admin", "topic", "create", "CliTopic", "--queues", "2", namesrv=namesrv)
    assert created.returncode == 0, created.stderr
    route = ferry("admin", "topic", "route", "CliTopic", "--json", namesrv=namesrv)
    for _ in range(50):
        if route.returncode == 0:
            break
        route = ferry("admin", "topic", "route", "CliTopic", "--json", namesrv=namesrv)
    body = json.loads(route.stdout)
    assert [q["writeQueueNums"] for q in body["queueDatas"]] == [2]
    assert "0" in body["brokerDatas"][0]["brokerAddrs"]
    assert (
        "CliTopic"
        in json.loads(ferry("admin", "topic", "list", "--json", namesrv=namesrv).stdout)[
            "topicList"
        ]
    )
    clusters = json.loads(ferry("admin", "cluster", "list", "--json", namesrv=namesrv).stdout)
    assert clusters["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}

    produced = ferry(
        "produce",
        "CliTopic",
        "--key",
        "k1",
        "--tag",
        "T",
        "--json",
        stdin="one\ntwo\nthree\n",
        namesrv=namesrv,
    )
    assert produced.returncode == 0, produced.stderr
    results = [json.loads(line) for line in produced.stdout.splitlines()]
    assert len(results) == 3
    consumed = ferry(
        "consume",
        "CliTopic",
        "--group",
        "cli",
        "--from",
        "earliest",
        "--max",
        "3",
        "--json",
        namesrv=namesrv,
    )
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(json.loads(line)["body"] for line in consumed.stdout.splitlines()) == [
        "one",
        "three",
        "two",
    ]
    again = ferry("consume", "CliTopic", "--group", "cli", "--idle-exit", "0.5", namesrv=namesrv)
    assert again.stdout == ""  # the group's offsets were committed on exit
    progress = json.loads(
        ferry("admin", "consumer", "progress", "cli", "--json", namesrv=namesrv).stdout
    )
    assert sum(e["consumerOffset"] for e in progress["offsetTable"]) == 3
    reset = ferry(
        "admin",
        "offset",
        "reset",
        "--group",
        "cli",
        "--topic",
        "CliTopic",
        "--to",
        "earliest",
        namesrv=namesrv,
    )
    assert reset.returncode == 0, reset.stderr
    replay = ferry("consume", "CliTopic", "--group", "cli", "--max", "3", namesrv=namesrv)
    assert sorted(replay.stdout.split()) == ["one", "three", "two"]
    by_key = json.loads(
        ferry("admin", "message", "by-key", "CliTopic", "k1", "--json", namesrv=namesrv).stdout
    )
    assert sorted(m["body"] for m in by_key) == ["one", "three", "two"]
    by_id = json.loads(
        ferry(
            "admin", "message", "by-id", results[1]["offsetMsgId"], "--json", namesrv=namesrv
        ).stdout
    )
    assert by_id[0]["body"] == "two"
    status = json.loads(
        ferry("admin", "topic", "status", "CliTopic", "--json", namesrv=namesrv).stdout
    )
    assert sum(e["maxOffset"] for e in status["offsetTable"]) == 3


def test_produce_can_schedule_delivery(servers: tuple[Server, Server]) -> None:
    namesrv, _ = servers
    created = ferry("admin", "topic", "create", "CliLater", "--queues", "1", namesrv=namesrv)
    assert created.returncode == 0, created.stderr
    produced = ferry("produce", "CliLater", "--delay-ms", "6000", stdin="later\n", namesrv=namesrv)
    for _ in range(50):  # the route reaches the NameServer just after the topic is created
        if produced.returncode == 0:
            break
        time.sleep(0.1)
        produced = ferry(
            "produce", "CliLater", "--delay-ms", "6000", stdin="later\n", namesrv=namesrv
        )
    assert produced.returncode == 0, produced.stderr

    def consume() -> list[str]:
        done = ferry(
            "consume", "CliLater", "--group", "later", "--from", "earliest", "--idle-exit",
            "0.3", "--json", namesrv=namesrv,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return [json.loads(line)["body"] for line in done.stdout.splitlines()]

    assert consume() == []  # held by the broker's timer until it is due
    deadline = time.monotonic() + 60
    while not (got := consume()):
        assert time.monotonic() < deadline, "the scheduled message never arrived"
        time.sleep(0.5)
    assert got == ["later"]


def test_a_fenced_topic_is_created_shown_and_refuses_plain_produce(
    servers: tuple[Server, Server],
) -> None:
    namesrv, _ = servers
    missing = ferry("admin", "topic", "create", "CliFenced", "--fenced", namesrv=namesrv)
    assert missing.returncode != 0
    assert "--broker-name" in missing.stderr
    created = ferry(
        "admin", "topic", "create", "CliFenced", "--fenced", "--broker-name", "broker-a",
        namesrv=namesrv,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert "fenced topic CliFenced: 1 queues" in created.stdout
    shown = ferry("admin", "topic", "fence", "CliFenced", "--json", namesrv=namesrv)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {"epoch": 0, "writer": "", "url": "", "liveStartOffset": 0}
    produced = ferry("produce", "CliFenced", stdin="plain\n", namesrv=namesrv)
    assert produced.returncode != 0
    assert "fenced" in produced.stderr


def test_a_group_is_drained_and_opened_again_through_the_nameserver(
    servers: tuple[Server, Server],
) -> None:
    namesrv, _ = servers
    created = ferry("admin", "topic", "create", "CliDrain", "--queues", "1", namesrv=namesrv)
    assert created.returncode == 0, created.stderr
    wiped = ferry("admin", "broker", "wipe-write-perm", "broker-a", "--json", namesrv=namesrv)
    assert wiped.returncode == 0, wiped.stderr
    assert json.loads(wiped.stdout)["topics"][namesrv.addr] >= 1
    route = ferry("admin", "topic", "route", "CliDrain", "--json", namesrv=namesrv)
    assert json.loads(route.stdout)["queueDatas"][0]["perm"] == 4
    refused = ferry("produce", "CliDrain", stdin="nowhere\n", namesrv=namesrv)
    assert refused.returncode != 0
    assert "no writable queue" in refused.stderr
    added = ferry("admin", "broker", "add-write-perm", "broker-a", namesrv=namesrv)
    assert added.returncode == 0, added.stderr
    assert "broker-a" in added.stdout
    produced = ferry("produce", "CliDrain", stdin="again\n", namesrv=namesrv)
    assert produced.returncode == 0, produced.stderr
    classic = ferry("admin", "broker", "switchover", "broker-a", namesrv=namesrv)
    assert classic.returncode == 1
    assert "no slave" in classic.stderr


def test_mqadmin_names_run_against_real_servers(servers: tuple[Server, Server]) -> None:
    namesrv, _ = servers
    created = ferry("admin", "updateTopic", "-n", namesrv.addr, "-t", "MqProc", "-w", "2")
    assert created.returncode == 0, created.stderr
    route = ferry("admin", "topicRoute", "-n", namesrv.addr, "-t", "MqProc")
    assert json.loads(route.stdout)["queueDatas"][0]["writeQueueNums"] == 2
    produced = ferry("produce", "MqProc", stdin="a\nb\n", namesrv=namesrv)
    assert produced.returncode == 0, produced.stderr
    stats = ferry("admin", "stats-all", "--topic", "MqProc", "--json", namesrv=namesrv)
    assert [(r["group"], r["msg24Hour"]) for r in json.loads(stats.stdout)] == [(None, 2)]
    bad = ferry("admin", "updateTopic", "-n", namesrv.addr, "-t", "MqProc", "-r", "2")
    assert bad.returncode == 2
    assert bad.stderr == "ferry: error: No such option '-r'.\n"


def test_bench_commands_print_a_json_summary_last(servers: tuple[Server, Server]) -> None:
    namesrv, _ = servers
    ferry("admin", "topic", "create", "BenchCli", "--queues", "2", namesrv=namesrv)
    for mode, extra in (
        ("produce", ["--window", "8"]),
        ("consume", []),
        ("e2e", ["--window", "8"]),
    ):
        done = ferry(
            "bench",
            mode,
            "--topic",
            "BenchCli",
            "--count",
            "200",
            "--size",
            "100",
            "--json",
            *extra,
            namesrv=namesrv,
        )
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout.splitlines()[-1])
        assert summary["messages"] == 200, summary
        assert summary["errors"] == 0


@pytest.mark.skipif(
    not shutil.which("nats-server"), reason="needs nats-server (.ci/run installs it)"
)
def test_bench_replication_rows_every_system_and_mode_with_its_ratios(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "ferrymq.cmd.ferry", "bench", "replication",
            "--sizes", "100", "--seconds", "0.6", "--rounds", "2", "--window", "16", "--json",
        ],
        capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["rounds"] == 2
    rows = {(r["system"], r["mode"]): r for r in summary["rows"]}
    assert sorted(rows) == [
        (system, mode)
        for system in ("ferrymq-r1", "ferrymq-r3", "nats-jetstream-r1", "nats-jetstream-r3")
        for mode in ("sync", "window 16")
    ]
    for row in rows.values():
        assert row["messages"] > 0, row
        assert row["failed"] == 0, row
        assert 0.5 <= row["seconds"] < 5, row  # two slices of 0.3 s each, not the whole run
    for ratio in summary["ratios"]:
        r3 = rows[("ferrymq-r3", ratio["mode"])]["msgs_per_s"]
        assert ratio["r3_over_r1"] == pytest.approx(
            r3 / rows[("ferrymq-r1", ratio["mode"])]["msgs_per_s"], abs=0.01
        )
        nats_r3 = rows[("nats-jetstream-r3", ratio["mode"])]["msgs_per_s"]
        assert ratio["r3_over_nats_r3"] == pytest.approx(r3 / nats_r3, abs=0.01)
        assert ratio["nats_r3_over_r1"] == pytest.approx(
            nats_r3 / rows[("nats-jetstream-r1", ratio["mode"])]["msgs_per_s"], abs=0.01
        )


def test_bench_store_reports_both_ratios_and_every_measurement(tmp_path: Path) -> None:
    done = ferry(
        "bench",
        "store",
        "--quick",
        "--sizes",
        "1024",
        "--batches",
        "64",
        "--json",
        "--dir",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["headline_case"] == {"size": 1024, "batch": 64}
    (case,) = summary["cases"]
    for name in (
        "raw_write",
        "async_append",
        "async_append_sparse",
        "raw_write_fsync",
        "sync_append",
        "sync_append_sparse",
        "dispatch",
        "replay",
        "read",
    ):
        assert case[f"{name}_msg_s"] > 0, name
    assert summary["async_ratio"] == round(case["async_append_mb_s"] / case["raw_write_mb_s"], 3)
    assert summary["sync_ratio"] == pytest.approx(
        case["sync_append_mb_s"] / case["raw_write_fsync_mb_s"], abs=0.01
    )
    assert list(tmp_path.iterdir()) == []  # every case cleans up after itself


@pytest.mark.parametrize(
    "args",
    [
        ("admin", "topic", "create"),
        ("consume", "T"),
        ("nosuch",),
        ("admin", "--namesrv", "127.0.0.1:1", "topic", "list"),
        ("admin", "topic", "create", "bad topic!"),
        ("bench", "produce", "--topic", "T", "--size", "0"),
        ("broker", "--listen-port", "notaport"),
        ("admin", "offset", "reset", "--group", "g", "--topic", "t"),
        ("produce", "T", "--delay-ms", "1", "--deliver-at-ms", "2"),
    ],
)
def test_bad_usage_is_one_line_and_nonzero(args: tuple[str, ...], tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ferrymq.cmd.ferry", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("ferry: error: ")
    assert "Traceback" not in done.stderr
