"""Connect (seed 002): workers, the fenced config log, REST, membership and assignment."""
