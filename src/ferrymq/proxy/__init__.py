"""The RocketMQ 5 endpoint (`ferry proxy`): MessagingService v2 over gRPC for the official 5.x SDKs.

Stateless: every RPC is relayed to the cluster through ferrymq's own SDK (routes from the
NameServers, failovers followed as the SDK follows them), and every route it answers names the
endpoint itself, so any number of endpoints can serve the same cluster.

Stubs, decided: no generated code. The `apache.rocketmq.v2` schema is taken from the descriptors
that PyPI `rocketmq-python-client` 5.1.2 (Apache-2.0) ships in its generated stubs, read out of its
wheel at build time (`python -m ferrymq.proxy.stubs`, run by `make setup` and `.ci/run`, else on
first use) into ferrymq's cache, and message classes are built from them at start in a private
descriptor pool (`stubs.py`); the servicer is registered as a generic handler. This avoids both a
protoc step and the top-level module `rocketmq`, which the 5.x package shares with the 4.x client
the compatibility tests use: the 5.x client itself only ever runs in its own virtual environment.
"""
