"""Every mqadmin alias (cli/mqadmin_alias.py) hands its ferry command exactly what the ferry
spelling does: both are parsed by click, and the values the command would be called with are
compared (no cluster: the command's own parameters with a callback that records them)."""

import datetime
from typing import Any

import click
import pytest

from ferrymq.cli.admin import admin_group
from ferrymq.cli.mqadmin_alias import ALIASES, _alias_command, _resolve

NS = "127.0.0.2:9876"
ADDR = "127.0.0.1:10911"
END_MS = int(datetime.datetime(2026, 11, 26, 10, 0, 0, 123000).timestamp() * 1000)

# mqadmin's arguments (after -n NS) -> the ferry command's (`ferry admin --namesrv NS PATH ...`)
CASES: dict[str, tuple[list[str], list[str]]] = {
    "updateTopic": (["-t", "T", "-c", "C", "-w", "4", "-o", "true"],
                    ["T", "--cluster", "C", "--queues", "4", "--order"]),
    "deleteTopic": (["--topic", "T", "--clusterName", "C"], ["T", "--cluster", "C"]),
    "topicRoute": (["-t", "T"], ["T", "--json"]),
    "topicStatus": (["-t", "T", "--json"], ["T", "--json"]),
    "topicList": ([], []),
    "clusterList": (["--json"], ["--json"]),
    "updateTopicPerm": (["-t", "T", "-p", "4"], ["T", "--perm", "4"]),
    "updateSubGroup": (
        ["-g", "G", "-c", "C", "-s", "false", "-m", "true", "-d", "false", "-q", "2", "-r", "5",
         "-i", "1", "-w", "1", "-a", "true", "-o", "false"],
        ["G", "--cluster", "C", "--no-consume-enable", "--consume-from-min", "--no-broadcast",
         "--retry-queues", "2", "--retry-max-times", "5", "--broker-id", "1",
         "--which-broker-when-slow", "1", "--notify-ids-changed", "--no-fifo"],
    ),
    "deleteSubGroup": (["-g", "G", "-c", "C", "-r", "true"],
                       ["G", "--cluster", "C", "--clean-offset"]),
    "cloneGroupOffset": (["-s", "A", "-d", "B", "-t", "T"],
                         ["--src", "A", "--dest", "B", "--topic", "T"]),
    "consumerProgress": (["-g", "G", "-t", "T"], ["G", "--topic", "T"]),
    "consumerConnection": (["--groupName", "G"], ["G"]),
    "consumerStatus": (["-g", "G", "-i", "c1"], ["G", "--client-id", "c1"]),
    "producerConnection": (["-g", "P", "-t", "T"], ["P", "--topic", "T"]),
    "resetOffsetByTime": (["-g", "G", "-t", "T", "-s", "1700000000000", "-f", "false"],
                          ["--group", "G", "--topic", "T", "--timestamp", "1700000000000",
                           "--no-force"]),
    "brokerStatus": (["-b", ADDR], ["--broker-addr", ADDR]),
    "statsAll": (["-t", "T"], ["--topic", "T"]),
    "haStatus": (["-c", "C"], ["--cluster", "C"]),
    "getBrokerConfig": (["--brokerAddr", ADDR], ["--broker-addr", ADDR]),
    "updateBrokerConfig": (["-c", "C", "-k", "maxMessageSize", "-v", "2000"],
                           ["maxMessageSize=2000", "--cluster", "C"]),
    "wipeWritePerm": (["-b", "broker-a"], ["broker-a"]),
    "addWritePerm": (["--brokerName", "broker-a"], ["broker-a"]),
    "queryMsgByOffset": (["-t", "T", "-b", "broker-a", "-i", "1", "-o", "7"],
                         ["--topic", "T", "--broker-name", "broker-a", "--queue", "1",
                          "--offset", "7"]),
    "printMsg": (["-t", "T", "-b", "1700000000000", "-e", "2026-11-26#10:00:00:123"],
                 ["T", "--begin-ms", "1700000000000", "--end-ms", str(END_MS)]),
    "queryMsgByKey": (["-t", "T", "-k", "K"], ["T", "K"]),
    "queryMsgById": (["-i", "ID"], ["ID"]),
    "getNamesrvConfig": ([], []),
    "updateNamesrvConfig": (["-k", "brokerTimeout", "-v", "20"], ["brokerTimeout=20"]),
    "updateKvConfig": (["-s", "NS", "-k", "K", "-v", "V"], ["NS", "K", "V"]),
    "deleteKvConfig": (["-s", "NS", "-k", "K"], ["NS", "K"]),
    "createUser": (["-c", "C", "-u", "u", "-p", "pw", "-t", "Super"],
                   ["u", "--password", "pw", "--user-type", "Super", "--cluster", "C"]),
    "updateUser": (["-b", ADDR, "-u", "u", "-s", "disable"],
                   ["u", "--user-status", "disable", "--broker", ADDR]),
    "deleteUser": (["-u", "u", "--json"], ["u", "--json"]),
    "getUser": (["-u", "u"], ["u"]),
    "listUser": (["-f", "al"], ["--filter", "al"]),
    "createAcl": (["-s", "User:u", "-r", "Topic:T", "-a", "Pub,Sub", "-i", "127.0.0.1",
                   "-d", "Deny"],
                  ["User:u", "--resources", "Topic:T", "--actions", "Pub,Sub",
                   "--source-ip", "127.0.0.1", "--decision", "Deny"]),
    "updateAcl": (["-s", "User:u", "-r", "Group:G", "-a", "Sub"],
                  ["User:u", "--resources", "Group:G", "--actions", "Sub"]),
    "deleteAcl": (["-s", "User:u", "-r", "Topic:T"], ["User:u", "--resources", "Topic:T"]),
    "getAcl": (["-s", "User:u"], ["User:u"]),
    "listAcl": (["-s", "User:", "-r", "Topic:"],
                ["--subject-filter", "User:", "--resource-filter", "Topic:"]),
}  # fmt: skip


def test_the_cases_walk_the_whole_table() -> None:
    assert sorted(CASES) == sorted(a.name for a in ALIASES)
    assert len(ALIASES) == 40


@pytest.mark.parametrize("alias", ALIASES, ids=lambda a: a.name)
def test_an_alias_calls_its_command_as_the_ferry_spelling_does(alias: Any) -> None:
    mqadmin, ferry = CASES[alias.name]
    target = _resolve(admin_group, alias.path)
    registered = admin_group.commands[alias.name]
    assert registered.help == f"mqadmin {alias.name}: runs `ferry admin {' '.join(alias.path)}`."
    calls: list[tuple[str, dict[str, Any]]] = []

    def record(**values: Any) -> None:
        calls.append((click.get_current_context().obj["namesrv"], values))

    recorder = click.Command(target.name, params=target.params, callback=record)
    built = _alias_command(alias, recorder)
    assert [p.opts for p in built.params] == [p.opts for p in registered.params]
    built.main(["-n", NS, *mqadmin], standalone_mode=False, obj={"namesrv": "127.0.0.1:1"})
    recorder.main(ferry, standalone_mode=False, obj={"namesrv": NS})
    assert len(calls) == 2
    assert calls[0] == calls[1]
