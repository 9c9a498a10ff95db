"""The asyncio edge: remoting connections, servers with routing tables, and clients."""
