"""The controller: a Raft-replicated state machine for broker ids, SyncStateSets and elections.

Pure core (no asyncio, no sockets): `state` (the replicated state and its deterministic `apply`),
`decide` (requests -> events + responses, never mutating), `election` (choosing a master),
`liveness` (this node's heartbeat table), `config` (election and lease policy). The asyncio shell
is `server`: it serializes decisions on the leader, proposes their events through Raft and answers
once they are applied. `cmd/controller.py` composes it with the Raft driver, standalone or on a
NameServer's port; `client/controller_admin.py` is the client brokers and operators use.

What a broker in controller mode (issue 7) can rely on:
- Registration (seed 000): GetNextBrokerId, ApplyBrokerId (a retry with the same check code
  succeeds again; a taken id answers CONTROLLER_BROKER_ID_INVALID), RegisterBrokerToController
  (answers the master only while it is presumed active).
- Heartbeats go to the leader (`ControllerAdmin.heartbeat` follows CONTROLLER_NOT_LEADER). The
  leader's SUCCESS carries `masterLeaseMills`: a master may accept writes until that long after
  it *sent* the heartbeat the leader answered, and must stop when it runs out. The controller
  replaces a master only `masterLeaseMillis + leaseMarginMillis` after the last heartbeat it
  received from it, and never within the grace period after a leader change. A closed
  connection marks a broker dead at once, so keep the heartbeat connection open.
- Heartbeats carry the broker's last epoch and max commit-log offset: elections rank live
  SyncStateSet members by (epoch, max offset, lower `electionPriority`, lower id).
- After an election the leader pushes NOTIFY_BROKER_ROLE_CHANGED (oneway) to the group's live
  brokers; GetReplicaInfo gives the same facts for polling. Act on a higher master epoch only.
- The first election of a group is held by the controller itself once every registered replica
  is alive (or `firstElectionWaitMillis` passed); a broker asking for it earlier gets
  CONTROLLER_ELECT_MASTER_FAILED and asks again, and CONTROLLER_MASTER_STILL_EXIST is an answer
  naming the current master.
- AlterSyncStateSet is fenced by master id, master epoch and SyncStateSet epoch; every member
  must be registered and alive on the leader.
"""
