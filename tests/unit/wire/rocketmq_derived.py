"""Bodies as RocketMQ writes them, derived from its Java classes where no recording was found.

Each is derived from the named class at apache/rocketmq 8fc57f1 (2025-09): its fields and
getters, written as FastJSON 1.x writes a bean (`RemotingSerializable.toJson`): properties
sorted by name, a getter `isX()` as `x`, nulls left out, longs plainly, doubles with a
fraction (`0.0`), enums by name, a map with number keys unquoted (`{1:"..."}`). A Java
`HashMap` or `HashSet` keeps its own order; the entries here are in sorted order. These are
written here from those facts; none was copied. Recorded bodies are in `rocketmq_recorded.py`.
"""

from .rocketmq_recorded import SUBSCRIPTION_GROUP_5X

CLIENT = "127.0.0.1@4242#1"
CLIENT_2 = "127.0.0.1@4243#2"
CLIENT_ADDR = "127.0.0.1:50000"
MQ = b'{"brokerName":"broker-a","queueId":0,"topic":"T"}'
"""A `MessageQueue` (common/message/MessageQueue.java): brokerName, queueId, topic."""

SUBSCRIPTION = (
    b'{"classFilterMode":false,"codeSet":[],"expressionType":"TAG","subString":"*",'
    b'"subVersion":1700000000000,"tagsSet":[],"topic":"T"}'
)
"""`SubscriptionData` (heartbeat/SubscriptionData.java; `filterClassSource` is not serialized),
in the order of the recorded `HEARTBEAT_SUBSCRIPTION_4X`."""

HEART_BEAT = (
    b'{"clientID":"' + CLIENT.encode() + b'","consumerDataSet":[{"consumeFromWhere":'
    b'"CONSUME_FROM_LAST_OFFSET","consumeType":"CONSUME_PASSIVELY","groupName":"G",'
    b'"messageModel":"CLUSTERING","subscriptionDataSet":[' + SUBSCRIPTION + b"],"
    b'"unitMode":false}],"heartbeatFingerprint":0,"producerDataSet":[{"groupName":"PG"}],'
    b'"withoutSub":false}'
)
"""HEART_BEAT (34) request: `HeartbeatData` (heartbeat/HeartbeatData.java, with `ConsumerData`
and `ProducerData`); `heartbeatFingerprint` and `withoutSub` are RocketMQ 5's heartbeat v2."""

CONSUMER_LIST = b'{"consumerIdList":["' + CLIENT.encode() + b'","' + CLIENT_2.encode() + b'"]}'
"""GET_CONSUMER_LIST_BY_GROUP (38) answer: `GetConsumerListByGroupResponseBody`."""

LOCK_BATCH_REQUEST = (
    b'{"clientId":"' + CLIENT.encode() + b'","consumerGroup":"G","mqSet":[' + MQ + b"],"
    b'"onlyThisBroker":false}'
)
"""LOCK_BATCH_MQ (41) and UNLOCK_BATCH_MQ (42) requests: `LockBatchRequestBody` and
`UnlockBatchRequestBody` (the same four properties)."""

LOCK_BATCH_RESPONSE = b'{"lockOKMQSet":[' + MQ + b"]}"
"""LOCK_BATCH_MQ (41) answer: `LockBatchResponseBody` (getter `getLockOKMQSet`)."""

DATA_VERSION = b'{"counter":3,"stateVersion":0,"timestamp":1700000000000}'
"""`DataVersion` (remoting/protocol/DataVersion.java; `counter` is an AtomicLong, a number)."""

TOPIC_CONFIG = (
    b'{"attributes":{},"order":false,"perm":6,"readQueueNums":8,'
    b'"topicFilterType":"SINGLE_TAG","topicName":"T","topicSysFlag":0,"writeQueueNums":8}'
)
"""A `TopicConfig` (common/TopicConfig.java; `topicMessageType` is not serialized), as
GET_TOPIC_CONFIG (351) answers it (recorded: `TOPIC_CONFIG_5X`) and topic tables hold it."""

TOPIC_CONFIG_WRAPPER = (
    b'{"dataVersion":' + DATA_VERSION + b',"mappingDataVersion":' + DATA_VERSION + b","
    b'"topicConfigTable":{"T":' + TOPIC_CONFIG + b'},"topicQueueMappingDetailMap":{}}'
)
"""GET_ALL_TOPIC_CONFIG (21) answer: `TopicConfigAndMappingSerializeWrapper`, as
`AdminBrokerProcessor.getAllTopicConfig` fills it (the static-topic mapping's data version and
detail map set, its info map null)."""

REGISTER_BROKER = (
    b'{"filterServerList":[],"topicConfigSerializeWrapper":' + TOPIC_CONFIG_WRAPPER + b"}"
)
"""REGISTER_BROKER (103) request, uncompressed: `RegisterBrokerBody` (its wrapper a
`TopicConfigAndMappingSerializeWrapper`)."""

GROUP_WRAPPER = (
    b'{"dataVersion":' + DATA_VERSION + b',"forbiddenTable":{},'
    b'"subscriptionGroupTable":{"MyGroup":' + SUBSCRIPTION_GROUP_5X + b"}}"
)
"""GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) answer: `SubscriptionGroupWrapper` around the recorded
`SubscriptionGroupConfig`."""

RUNTIME_INFO = b'{"table":{"brokerVersionDesc":"V5_3_2","msgPutTotalTodayNow":"5"}}'
"""GET_BROKER_RUNTIME_INFO (28) answer: `KVTable`."""

CONNECTION = (
    b'{"clientAddr":"' + CLIENT_ADDR.encode() + b'","clientId":"' + CLIENT.encode() + b'",'
    b'"language":"JAVA","version":453}'
)
"""A `Connection` (body/Connection.java; `language` a LanguageCode, by name)."""

CONSUMER_CONNECTION = (
    b'{"connectionSet":[' + CONNECTION + b'],"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
    b'"consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING",'
    b'"subscriptionTable":{"T":' + SUBSCRIPTION + b"}}"
)
"""GET_CONSUMER_CONNECTION_LIST (203) answer: `ConsumerConnection`."""

PRODUCER_CONNECTION = b'{"connectionSet":[' + CONNECTION + b"]}"
"""GET_PRODUCER_CONNECTION_LIST (204) answer: `ProducerConnection`."""

GROUP_LIST = b'{"groupList":["G1","G2"]}'
"""QUERY_TOPIC_CONSUME_BY_WHO (300) answer: `GroupList`."""

BROKER_STATS = (
    b'{"statsDay":{"avgpt":0.0,"sum":120,"tps":0.5},"statsHour":{"avgpt":0.0,"sum":60,'
    b'"tps":0.25},"statsMinute":{"avgpt":0.0,"sum":6,"tps":0.1}}'
)
"""VIEW_BROKER_STATS_DATA (315) answer: `BrokerStatsData` of three `BrokerStatsItem`s."""

PRODUCER_TABLE = (
    b'{"data":{"PG":[{"clientId":"' + CLIENT.encode() + b'","language":"JAVA",'
    b'"lastUpdateTimestamp":1700000000000,"remoteIP":"' + CLIENT_ADDR.encode() + b'",'
    b'"version":453}]}}'
)
"""GET_ALL_PRODUCER_INFO (328) answer: `ProducerTableInfo` of `ProducerInfo`s (`getRemoteIP`)."""

TOPIC_LIST = b'{"topicList":["T1","T2"]}'
"""GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206) and GET_TOPICS_BY_CLUSTER (224) answers:
`TopicList` (`brokerAddr` null, left out)."""

SYSTEM_TOPIC_LIST = b'{"brokerAddr":"127.0.0.1:10911","topicList":["DefaultCluster","broker-a"]}'
"""GET_SYSTEM_TOPIC_LIST_FROM_NS (304) answer: `TopicList` from RocketMQ's
`RouteInfoManager.getSystemTopicList` (cluster names and broker names, one broker's address);
FastJSON writes fields by name."""

SYSTEM_TOPIC_LIST_FROM_BROKER = b'{"topicList":["SCHEDULE_TOPIC_XXXX","TBW102"]}'
"""GET_SYSTEM_TOPIC_LIST_FROM_BROKER (305) answer: `TopicList` from RocketMQ's
`AdminBrokerProcessor.getSystemTopicListFromBroker` (`TopicValidator.getSystemTopicSet()`, no
`brokerAddr`: the null is left out)."""

CONSUME_DIRECTLY_RESULT = (
    b'{"autoCommit":true,"consumeResult":"CR_SUCCESS","order":false,"spentTimeMills":12}'
)
"""CONSUME_MESSAGE_DIRECTLY (309) answer (the client's, relayed by the broker as it is):
`ConsumeMessageDirectlyResult` (remoting/protocol/body/ConsumeMessageDirectlyResult.java:
`isOrder`, `isAutoCommit`, `consumeResult` a `CMResult` by name, `remark`, `spentTimeMills`),
filled as `ConsumeMessageConcurrentlyService.consumeMessageDirectly` fills it; the null remark
is left out."""

CONSUME_DIRECTLY_THREW = (
    b'{"autoCommit":true,"consumeResult":"CR_THROW_EXCEPTION","order":true,"remark":"boom",'
    b'"spentTimeMills":3}'
)
"""The same from an orderly consumer (`ConsumeMessageOrderlyService` sets `order`) whose
listener threw: the remark is the error."""

CLUSTER_INFO = (
    b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"127.0.0.1:10911"},'
    b'"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false}},'
    b'"clusterAddrTable":{"DefaultCluster":["broker-a"]}}'
)
"""GET_BROKER_CLUSTER_INFO (106) answer of a 5.x NameServer: `ClusterInfo`, whose `BrokerData`
has `enableActingMaster` (and `zoneName`, null here) beyond the recorded 4.x body."""

SYNC_STATE_SET = b'{"syncStateSet":[1,2],"syncStateSetEpoch":3}'
"""CONTROLLER_ALTER_SYNC_STATE_SET (1001) request and CONTROLLER_GET_REPLICA_INFO (1004) answer:
`SyncStateSet`."""

ELECT_MASTER = (
    b'{"brokerMemberGroup":{"brokerAddrs":{1:"127.0.0.1:30911",2:"127.0.0.1:30921"},'
    b'"brokerName":"broker-a","cluster":"DefaultCluster"},"syncStateSet":[1,2]}'
)
"""CONTROLLER_ELECT_MASTER (1002) answer: `ElectMasterResponseBody` with `BrokerMemberGroup`."""

BROKER_NAMES = b'["broker-a"]'
"""CONTROLLER_GET_SYNC_STATE_DATA (1006) request: the group names, a JSON list
(`RemotingSerializable.encode(brokers)` in `MQClientAPIImpl`, mqadmin's side)."""

REPLICAS_INFO = (
    b'{"replicasInfoTable":{"broker-a":{"inSyncReplicas":[{"alive":true,'
    b'"brokerAddress":"127.0.0.1:30911","brokerId":1,"brokerName":"broker-a"}],'
    b'"masterAddress":"127.0.0.1:30911","masterBrokerId":1,"masterEpoch":2,'
    b'"notInSyncReplicas":[],"syncStateSetEpoch":3}}}'
)
"""CONTROLLER_GET_SYNC_STATE_DATA (1006) answer: `BrokerReplicasInfo` (its nested `ReplicasInfo`
and `ReplicaIdentity`)."""

EPOCH_CACHE = (
    b'{"brokerId":1,"brokerName":"broker-a","clusterName":"DefaultCluster",'
    b'"epochList":[{"endOffset":1024,"epoch":1,"startOffset":0}],"maxOffset":1024}'
)
"""GET_BROKER_EPOCH_CACHE (1007) answer of a broker: `EpochEntryCache` of `EpochEntry`s."""

BATCH_ACK = (
    b'{"acks":[{"b":"BQ==","c":"G","it":30000,"pt":1700000000000,"q":0,"r":"0","rq":0,'
    b'"so":10,"t":"T"}],"brokerName":"broker-a"}'
)
"""BATCH_ACK_MESSAGE (200151) request: `BatchAckMessageRequestBody` of `BatchAck`s, whose fields
FastJSON writes by their `@JSONField` short names, sorted by those, the `BitSet` as the base64
of `toByteArray()` (`BitSetSerializerDeserializer`): 0x05, offsets 10 and 12."""

USER_INFO = b'{"password":"secret1","userStatus":"enable","userType":"Normal","username":"alice"}'
"""AUTH_CREATE_USER / AUTH_UPDATE_USER (3001/3002) request and AUTH_GET_USER (3004) answer:
`UserInfo` (`UserConverter.convertUser`, written by `JSON.toJSONString` in
`AdminBrokerProcessor.getUser`; RocketMQ's answer carries the password)."""

ACL_INFO = (
    b'{"policies":[{"entries":[{"actions":["Pub","Sub"],"decision":"Allow",'
    b'"resource":"Topic:T","sourceIps":["127.0.0.1"]}],"policyType":"Custom"}],'
    b'"subject":"User:alice"}'
)
"""AUTH_CREATE_ACL / AUTH_UPDATE_ACL (3006/3007) request and AUTH_GET_ACL (3009) answer:
`AclInfo` with a `PolicyInfo` and a `PolicyEntryInfo` (`AclConverter.convertAcl`)."""
