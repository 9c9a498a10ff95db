"""Master/slave replication of the commit log (the HA protocol), pure cores and asyncio edges."""
