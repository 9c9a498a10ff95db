"""The broker: stores messages and serves producers, consumers, slaves and admins."""
