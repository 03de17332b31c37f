"""`kafkatunnel verify`: did every consumer group and transactional id talk to its
coordinator? Decoding recordings into calls and events is pure Python over bytes; the
judging is a function of one group's events; job.py runs both on Spark (or in one process)."""
