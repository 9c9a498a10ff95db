"""Controller mode on the broker: persistent id, registration, heartbeats, role changes, lease.

Spec: reference/rocketmq-controller-spec.md sections 2 and 3 (RocketMQ `ReplicasManager`), with
ARCHITECTURE.md section 6 items 4 and 7:
- registration (seed 000): INITIAL -> GetNextBrokerId -> temp file -> ApplyBrokerId -> metadata
  file -> RegisterBrokerToController; every step resumes after a crash (`identity.py`). The
  broker stays fenced (no writes, no NameServer registration) until the controller names its role;
- heartbeats to the controller leader every `brokerHeartbeatInterval` carrying the last epoch,
  max and confirm offsets and the election priority; the leader's answer renews the master's
  lease (`BrokerHeartbeatResponseHeader.masterLeaseMills`, counted from when the heartbeat was
  sent), and a master whose lease ran out refuses writes until a heartbeat gets through;
- the group's master and SyncStateSet polled every `syncBrokerMetadataPeriod` and pushed by the
  controller (NOTIFY_BROKER_ROLE_CHANGED); a newer master epoch changes the role, a group with no
  master asks for an election (broker-triggered ElectMaster);
- SyncStateSet shrink and expand go to the controller (AlterSyncStateSet, fenced by the master
  epoch and the set's epoch) and apply locally only once it accepted them: the local set is
  always a superset of what the controller would elect from;
- topics are the controller's (issue 20 section 3, `topicsync.py`): registration fetches what
  the group should hold before the broker takes a role, heartbeat answers and pushes name the
  controller's topic version, and a master reconciles its table before leaving the fence.

Fault points for crash tests: `FERRYMQ_FAULT_POINTS=identity-after-temp,...` (comma-separated)
kills the process with SIGKILL when registration reaches that step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from typing import TYPE_CHECKING

from ferrymq.broker.authsync import AuthSync
from ferrymq.broker.controller_link import ControllerLink
from ferrymq.broker.identity import IdentityFiles, RegisterState
from ferrymq.broker.state import MasterLease
from ferrymq.broker.topicsync import TopicSync
from ferrymq.errors import FerryError, ProtocolError
from ferrymq.replication.syncstate import SyncStateChange
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.connection import Connection
from ferrymq.wire.bodies import decode_body, encode_body
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.controller import (
    AlterSyncStateSetRequestHeader,
    AlterSyncStateSetResponseHeader,
    ApplyBrokerIdRequestHeader,
    BrokerHeartbeatRequestHeader,
    BrokerHeartbeatResponseHeader,
    ElectMasterRequestHeader,
    ElectMasterResponseBody,
    ElectMasterResponseHeader,
    EpochEntry,
    EpochEntryCache,
    GetNextBrokerIdRequestHeader,
    GetNextBrokerIdResponseHeader,
    GetReplicaInfoRequestHeader,
    GetReplicaInfoResponseHeader,
    NotifyBrokerRoleChangedRequestHeader,
    RegisterBrokerToControllerRequestHeader,
    RegisterBrokerToControllerResponseHeader,
    SyncStateSet,
    decode_sync_state_set,
)
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields

if TYPE_CHECKING:
    from ferrymq.broker.broker import Broker

__all__ = ["ReplicasManager", "fault_point"]

log = logging.getLogger(__name__)

FAULT_POINTS_ENV = "FERRYMQ_FAULT_POINTS"
_RETRY_S = 1.0


def fault_point(name: str) -> None:
    """Die here, as `kill -9` would, when a crash test enabled `name` (test-only hook)."""
    enabled = os.environ.get(FAULT_POINTS_ENV, "")
    if enabled and name in enabled.split(","):
        log.warning("fault point %s: killing this process", name)
        os.kill(os.getpid(), signal.SIGKILL)


class ReplicasManager:
    """One controller-mode broker's side of the controller protocol."""

    def __init__(self, broker: Broker, rpc: RpcClient) -> None:
        config = broker.config
        self.broker = broker
        self.link = ControllerLink(rpc, config.controller_addrs)
        self.files = IdentityFiles(
            config.identity_path, config.broker_cluster_name, config.broker_name
        )
        self.register_state = self.files.state()
        self.sync_state_set_epoch = 0
        self.lease_ms: int | None = None
        self._heartbeat_now = asyncio.Event()
        self._alter_in_flight = False
        self.topics = TopicSync(broker, self.link)
        self.auth = AuthSync(broker, self.link)
        broker.on_sync_state_change = self._propose_sync_state_set
        broker.on_role_change = self._role_changed
        broker.on_master = self.topics.reconcile_now

    def _role_changed(self) -> None:
        self._heartbeat_now.set()
        self.topics.wake()

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Register (retrying until the controller answers), then heartbeat and poll forever."""
        while True:
            if await self._try_register():
                break
            await asyncio.sleep(_RETRY_S)
        async with asyncio.TaskGroup() as group:
            group.create_task(self._heartbeat_loop())
            group.create_task(self._sync_loop())
            group.create_task(self.topics.run())
            group.create_task(self.auth.run())

    async def _try_register(self) -> bool:
        try:
            return await self.register()
        except (FerryError, ProtocolError) as exc:
            log.warning("registration with the controller failed: %s", exc)
            return False

    # ------------------------------------------------------------------ registration

    async def register(self) -> bool:
        """One pass of the registration state machine; returns whether it reached REGISTERED."""
        config, files = self.broker.config, self.files
        identity = files.load()
        if identity is None:
            temp = files.load_temp()
            if temp is None:
                response = await self.link.call(
                    RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                    GetNextBrokerIdRequestHeader(config.broker_cluster_name, config.broker_name),
                )
                _check(response, "GetNextBrokerId")
                next_id = from_ext_fields(
                    GetNextBrokerIdResponseHeader, response.ext_fields
                ).next_broker_id
                if next_id is None or next_id < 1:
                    raise ProtocolError(f"GetNextBrokerId answered id {next_id}")
                fault_point("identity-before-temp")
                temp = files.save_temp(next_id, f"{self.broker.address};{time.time_ns() // 10**6}")
                self.register_state = RegisterState.CREATE_TEMP_METADATA_FILE_DONE
                fault_point("identity-after-temp")
            response = await self.link.call(
                RequestCode.CONTROLLER_APPLY_BROKER_ID,
                ApplyBrokerIdRequestHeader(
                    config.broker_cluster_name,
                    config.broker_name,
                    temp.broker_id,
                    temp.register_check_code,
                ),
            )
            if response.code != ResponseCode.SUCCESS:
                log.warning(
                    "the controller refused broker id %d (%s): starting over",
                    temp.broker_id,
                    response.remark,
                )
                files.clear_temp()
                self.register_state = RegisterState.INITIAL
                return False
            fault_point("identity-after-apply")
            identity = files.save(temp.broker_id)
            self.register_state = RegisterState.CREATE_METADATA_FILE_DONE
            fault_point("identity-after-metadata")
        self.broker.broker_id = identity.broker_id
        response = await self.link.call(
            RequestCode.CONTROLLER_REGISTER_BROKER,
            RegisterBrokerToControllerRequestHeader(
                cluster_name=config.broker_cluster_name,
                broker_name=config.broker_name,
                broker_id=identity.broker_id,
                broker_address=self.broker.address,
            ),
        )
        _check(response, "RegisterBrokerToController")
        self.register_state = RegisterState.REGISTERED
        header = from_ext_fields(RegisterBrokerToControllerResponseHeader, response.ext_fields)
        members = decode_sync_state_set(response.body) if response.body else None
        log.info(
            "registered with the controller as broker %d of %s",
            identity.broker_id,
            config.broker_name,
        )
        await self._send_heartbeat()  # the controller learns this broker's offsets first
        # what the group should hold, before any role (topicsync rule 2); raises to retry
        if await self.topics.fetch() is not None:
            self.broker.state.topic_authority = self.topics
        await self.auth.fetch()  # the users and ACLs too (authsync.py)
        await self.apply(
            header.master_broker_id, header.master_address, header.master_epoch, members
        )
        return True

    # ------------------------------------------------------------------ roles

    async def apply(
        self,
        master_id: int | None,
        master_address: str | None,
        master_epoch: int | None,
        members: SyncStateSet | None,
        *,
        may_elect: bool = True,
    ) -> None:
        """Act on the controller's view of the group: change role, adopt its SyncStateSet."""
        broker = self.broker
        if master_id is None or master_id < 1 or not master_address or master_epoch is None:
            if may_elect:
                await self._elect()
            return
        newer_set = members is not None and (
            members.sync_state_set_epoch > self.sync_state_set_epoch
        )
        if members is not None and newer_set:
            self.sync_state_set_epoch = members.sync_state_set_epoch
        ids = frozenset(members.sync_state_set) if members else frozenset()
        if master_epoch < broker.master_epoch or (
            master_epoch == broker.master_epoch and not broker.fenced
        ):
            # what this broker already acts on (the periodic poll): at most a newer SyncStateSet,
            # or its master back at another address under the same epoch
            if master_epoch == broker.master_epoch and master_id != broker.broker_id:
                await broker.follow_master_at(master_address, master_epoch)
            replication = broker.replication
            if (
                master_id == broker.broker_id
                and master_epoch == broker.master_epoch
                and replication is not None
                and newer_set
            ):
                replication.apply_change(SyncStateChange(ids | {broker.broker_id}, "controller"))
            return
        if master_id == broker.broker_id:
            await broker.change_to_master(master_epoch, ids)
        else:
            await broker.change_to_slave(master_address, master_epoch)

    async def _elect(self) -> None:
        """Ask the controller to elect a master for this group (broker-triggered)."""
        config = self.broker.config
        response = await self.link.call(
            RequestCode.CONTROLLER_ELECT_MASTER,
            ElectMasterRequestHeader(
                cluster_name=config.broker_cluster_name,
                broker_name=config.broker_name,
                broker_id=self.broker.broker_id,
            ),
        )
        if response.code not in (ResponseCode.SUCCESS, ResponseCode.CONTROLLER_MASTER_STILL_EXIST):
            log.info("no master elected yet for %s: %s", config.broker_name, response.remark)
            return
        header = from_ext_fields(ElectMasterResponseHeader, response.ext_fields)
        members = None
        if response.body:
            body = decode_body(response.body, ElectMasterResponseBody)
            members = SyncStateSet(
                sync_state_set=body.sync_state_set,
                sync_state_set_epoch=header.sync_state_set_epoch or 0,
            )
        await self.apply(
            header.master_broker_id,
            header.master_address,
            header.master_epoch,
            members,
            may_elect=False,
        )

    async def notified(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """NOTIFY_BROKER_ROLE_CHANGED (1008): the controller elected a master for this group."""
        header = from_ext_fields(NotifyBrokerRoleChangedRequestHeader, request.ext_fields)
        members = decode_sync_state_set(request.body) if request.body else None
        if self.register_state is RegisterState.REGISTERED:
            await self.apply(
                header.master_broker_id,
                header.master_address,
                header.master_epoch,
                members,
                may_elect=False,
            )
        return request.make_response(ResponseCode.SUCCESS)

    async def epoch_cache(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """GET_BROKER_EPOCH_CACHE (1007): this broker's epoch file and max offset."""
        broker = self.broker
        config = broker.config
        entries = broker.epoch_entries
        end = broker.store.max_log_offset
        body = EpochEntryCache(
            cluster_name=config.broker_cluster_name,
            broker_name=config.broker_name,
            broker_id=broker.broker_id,
            epoch_list=[
                EpochEntry(
                    epoch=entry.epoch,
                    start_offset=entry.start_offset,
                    end_offset=entries[i + 1].start_offset if i + 1 < len(entries) else end,
                )
                for i, entry in enumerate(entries)
            ],
            max_offset=end,
        )
        return request.make_response(ResponseCode.SUCCESS, body=encode_body(body))

    async def _sync_loop(self) -> None:
        config = self.broker.config
        while True:
            await asyncio.sleep(config.sync_broker_metadata_period / 1000)
            try:
                await self.sync()
            except (FerryError, ProtocolError) as exc:
                log.info("could not read the group's replicas from the controller: %s", exc)

    async def sync(self) -> None:
        """Poll the group's master and SyncStateSet (GET_REPLICA_INFO) and act on it."""
        response = await self.link.call(
            RequestCode.CONTROLLER_GET_REPLICA_INFO,
            GetReplicaInfoRequestHeader(self.broker.config.broker_name),
        )
        if response.code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST:
            log.warning("the controller forgot this broker: registering again")
            await self.register()
            return
        _check(response, "GetReplicaInfo")
        header = from_ext_fields(GetReplicaInfoResponseHeader, response.ext_fields)
        members = decode_sync_state_set(response.body) if response.body else None
        await self.apply(
            header.master_broker_id, header.master_address, header.master_epoch, members
        )

    # ------------------------------------------------------------------ SyncStateSet

    def _propose_sync_state_set(self, change: SyncStateChange) -> bool:
        """The master's SyncStateSet wants to change: ask the controller; apply only on yes."""
        if not self._alter_in_flight:
            self._alter_in_flight = True
            task = asyncio.get_running_loop().create_task(self._alter(change))
            task.add_done_callback(lambda _: setattr(self, "_alter_in_flight", False))
        return False

    async def _alter(self, change: SyncStateChange) -> None:
        broker = self.broker
        epoch = broker.master_epoch
        body = SyncStateSet(
            sync_state_set=sorted(change.members),
            sync_state_set_epoch=self.sync_state_set_epoch,
        )
        try:
            response = await self.link.call(
                RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
                AlterSyncStateSetRequestHeader(broker.config.broker_name, broker.broker_id, epoch),
                encode_body(body),
            )
        except FerryError as exc:
            log.warning("AlterSyncStateSet %s failed: %s", sorted(change.members), exc)
            return
        if response.code != ResponseCode.SUCCESS:
            log.warning(
                "the controller refused SyncStateSet %s: %s",
                sorted(change.members),
                response.remark,
            )
            return
        header = from_ext_fields(AlterSyncStateSetResponseHeader, response.ext_fields)
        replication = broker.replication
        if replication is None or broker.master_epoch != epoch:
            return  # deposed meanwhile
        if header.new_sync_state_set_epoch is not None:
            self.sync_state_set_epoch = header.new_sync_state_set_epoch
        replication.apply_change(change)

    # ------------------------------------------------------------------ heartbeats and lease

    async def _heartbeat_loop(self) -> None:
        interval = self.broker.config.broker_heartbeat_interval / 1000
        while True:
            self._heartbeat_now.clear()
            with contextlib.suppress(FerryError, ProtocolError):
                await self._send_heartbeat()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._heartbeat_now.wait()

    async def _send_heartbeat(self) -> None:
        broker = self.broker
        config, state = broker.config, broker.state
        store = state.store
        sent_at = state.clock()
        header = BrokerHeartbeatRequestHeader(
            cluster_name=config.broker_cluster_name,
            broker_addr=broker.address,
            broker_name=config.broker_name,
            broker_id=broker.broker_id,
            epoch=broker.log_epoch,
            max_offset=store.max_log_offset,
            confirm_offset=store.confirm_offset,
            heartbeat_timeout_mills=config.controller_heart_beat_timeout_mills,
            election_priority=config.broker_election_priority,
        )
        try:
            response = await self.link.call(RequestCode.BROKER_HEARTBEAT, header)
        except FerryError as exc:
            log.debug("heartbeat: %s", exc)
            raise
        if response.code != ResponseCode.SUCCESS:
            log.info("the controller refused a heartbeat: %s", response.remark)
            return
        answer = from_ext_fields(BrokerHeartbeatResponseHeader, response.ext_fields)
        self.topics.heard(answer.topic_version)
        self.auth.heard(answer.auth_version)
        if answer.master_lease_mills is None:
            return
        self.lease_ms = answer.master_lease_mills
        if (
            state.is_master
            and answer.master_broker_id == broker.broker_id
            and answer.master_epoch == broker.master_epoch
        ):
            state.lease = MasterLease(sent_at, sent_at + answer.master_lease_mills / 1000)


def _check(response: RemotingCommand, what: str) -> None:
    if response.code != ResponseCode.SUCCESS:
        raise FerryError(f"{what}: the controller answered {response.code}: {response.remark}")
