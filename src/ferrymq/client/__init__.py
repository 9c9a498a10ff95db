"""The ferrymq SDK: routing, producers and consumers, on the RocketMQ remoting protocol."""
