"""What the runtime decides for every plugin's query: its name and its trigger interval."""

from ferrymq.connect.plugin import Plugins, query_name


def test_each_plugin_keeps_its_default_interval_and_takes_the_configured_one() -> None:
    plugins = Plugins()
    defaults = {
        "PostgresSink": 200,
        "FerrymqReplicator": 200,
        "FileSource": 1000,
        "FileSink": 1000,
        "PostgresSource": 5000,
    }
    for name, default in defaults.items():
        plugin = plugins.resolve(name)[1]()
        assert plugin.trigger_interval({}) == default, name
        key = "poll.interval.ms" if name == "PostgresSource" else "trigger.interval.ms"
        assert plugin.trigger_interval({key: "750"}) == 750, name
    assert query_name("orders sink", 3) == "orders sink-3"
