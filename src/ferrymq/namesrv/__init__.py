"""The NameServer: route table (pure) and its request handlers."""
