"""Bodies RocketMQ's own servers and serializer wrote, recorded, with where each was seen.

These are the shapes Apache's Java tools (mqadmin, the Dashboard, rocketmq-exporter) decode with
FastJSON; ferrymq's answers must match them byte for byte where the values are the same.
"""

RESET_OFFSET_BODY_4X = (
    b'{"offsetTable":{{"brokerName":"RaftNode00","queueId":0,"topic":"topicB"}:0,'
    b'{"brokerName":"RaftNode00","queueId":1,"topic":"topicB"}:0,'
    b'{"brokerName":"RaftNode00","queueId":2,"topic":"topicB"}:0,'
    b'{"brokerName":"RaftNode00","queueId":3,"topic":"topicB"}:0}}'
)
"""RESET_CONSUMER_CLIENT_OFFSET (220) body a RocketMQ 4.x broker (fastjson 1.2.76) sent after
`mqadmin resetOffsetByTime`: apache/rocketmq-client-go issue #759 (2021-12-21), whose decoder
panicked on it (fixed by PR #765)."""

CONSUME_STATS_4X = (
    b'{"consumeTps":0.0,"offsetTable":'
    b'{{"brokerName":"broker-a","queueId":7,"topic":"topic_test"}:'
    b'{"brokerOffset":0,"consumerOffset":0,"lastTimestamp":0},'
    b'{"brokerName":"broker-a","queueId":6,"topic":"topic_test"}:'
    b'{"brokerOffset":0,"consumerOffset":0,"lastTimestamp":0}}}'
)
"""GET_CONSUME_STATS (208) answer of a RocketMQ 4.x broker (no `pullOffset` yet), as quoted
(`ExamineConsumeStats: ...`, first two entries) in a public Go admin client's comment on
"Java's non-standard JSON"."""

CONSUME_STATS_5X = (
    b'{"consumeTps":1.5,"offsetTable":{{"brokerName":"broker-a","queueId":3,"topic":"MyTopic"}:'
    b'{"brokerOffset":100,"consumerOffset":90,"lastTimestamp":1700000000000,"pullOffset":0}}}'
)
"""`JSON.toJSONString(consumeStats)` with RocketMQ 5.5.1's classes on fastjson2 2.0.64, as
recorded by a Java probe in a public Python RocketMQ client's test fixtures."""

TOPIC_STATS_5X = (
    b'{"offsetTable":{{"brokerName":"broker-a","queueId":3,"topic":"MyTopic"}:'
    b'{"lastUpdateTimestamp":1700000000000,"maxOffset":500,"minOffset":0}},"topicPutTps":0.0}'
)
"""GET_TOPIC_STATS_INFO (202) body, same probe as `CONSUME_STATS_5X`. `topicPutTps` is in
`TopicStatsTable` at apache/rocketmq 8fc57f1 too (not at 188e635); ferrymq writes it."""

CLUSTER_INFO_4X = (
    b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"127.0.1.111:10911"},'
    b'"brokerName":"broker-a","cluster":"DefaultCluster"}},'
    b'"clusterAddrTable":{"DefaultCluster":["broker-a"]}}'
)
"""GET_BROKER_CLUSTER_INFO (106) answer of a RocketMQ 4.x NameServer (number keys unquoted),
quoted in the same Go client's comment as `CONSUME_STATS_4X`; its broker address, a private-range
one there, is a loopback address here (only 127.0.0.0/8 appears in this repository)."""

HEARTBEAT_SUBSCRIPTION_4X = (
    b'{"classFilterMode":false,"codeSet":[],"expressionType":"TAG","subString":"*",'
    b'"subVersion":1680444498755,"tagsSet":[],"topic":"gaohongbin-test"}'
)
"""One `SubscriptionData` of a Java 4.x push consumer's HEART_BEAT body (header version 373),
quoted in a public RocketMQ sidecar's source (`ConnectionManager::onHeartbeat`): FastJSON's field
order, which GET_CONSUMER_CONNECTION_LIST's `subscriptionTable` values take too."""

TOPIC_ROUTE_52 = (
    b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911"},"brokerName":"broker-a",'
    b'"cluster":"DefaultCluster","enableActingMaster":false}],"filterServerTable":{},'
    b'"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,'
    b'"writeQueueNums":4}]}'
)
"""GET_ROUTEINFO_BY_TOPIC (105) `TopicRouteData` as RocketMQ 5.2's `mqadmin topicRoute` printed
it (FastJSON, pretty-printed; its line breaks and tabs taken out here), quoted in a public Go
RocketMQ console's parser tests ("RocketMQ 5.2 unquoted broker id"): the broker id key unquoted,
`enableActingMaster` written, the null `orderTopicConf` and `zoneName` left out."""

TOPIC_CONFIG_5X = (
    b'{"attributes":{"+fileReservedTime":"72","+deleteWhen":"04"},"order":false,"perm":6,'
    b'"readQueueNums":16,"topicFilterType":"SINGLE_TAG","topicName":"attr-topic",'
    b'"topicSysFlag":0,"writeQueueNums":16}'
)
"""`JSON.toJSONString(new TopicConfig("attr-topic"))` with two attributes, same probe as
`CONSUME_STATS_5X`: GET_TOPIC_CONFIG (351)'s answer for a topic that is not static (its
`mappingDetail` null, left out). The attributes are in the Java HashMap's order."""

SUBSCRIPTION_GROUP_5X = (
    b'{"attributes":{},"brokerId":0,"consumeBroadcastEnable":true,"consumeEnable":true,'
    b'"consumeFromMinEnable":true,"consumeMessageOrderly":false,"consumeTimeoutMinute":15,'
    b'"groupName":"MyGroup","groupRetryPolicy":{"type":"CUSTOMIZED"},"groupSysFlag":0,'
    b'"notifyConsumerIdsChangedEnable":true,"retryMaxTimes":16,"retryQueueNums":1,'
    b'"whichBrokerWhenConsumeSlowly":1}'
)
"""`JSON.toJSONString(new SubscriptionGroupConfig())` named MyGroup, same probe as
`CONSUME_STATS_5X`: GET_SUBSCRIPTIONGROUP_CONFIG (352)'s answer and
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200)'s request (null `subscriptionDataSet` left out)."""
