"""Process entry points: the composition roots that put servers and tools together."""
