"""The controller: a Raft-replicated state machine for broker ids, SyncStateSets and elections.

Pure core (no asyncio, no sockets): `state` (the replicated state and its deterministic `apply`),
`decide` (requests -> events + responses, never mutating), `election` (choosing a master),
`liveness` (this node's heartbeat table), `config` (election and lease policy). The asyncio shell
is `server`: it serializes decisions on the leader, proposes their events through Raft and answers
once they are applied.
"""
