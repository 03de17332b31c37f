"""Which `__consumer_offsets` (or `__transaction_state`) partition coordinates a key.

Kafka computes `Utils.abs(key.hashCode()) % partitions`, where `hashCode` is Java's
String.hashCode over UTF-16 code units with 32-bit overflow, and `Utils.abs` maps
Integer.MIN_VALUE to 0 (it is not `abs(h % n)`; they differ when the hash is MIN_VALUE).
The coordinator is the leader of that partition.
"""

from __future__ import annotations

from array import array

DEFAULT_PARTITIONS = 50  # offsets.topic.num.partitions and transaction.state.log.num.partitions
GROUP_TOPIC = "__consumer_offsets"
TRANSACTION_TOPIC = "__transaction_state"
_INT_MIN = -(2**31)

# The answers that say a request did not reach (or not yet) the key's coordinator.
NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS = 16, 15, 14
COORDINATOR_ERRORS = {
    NOT_COORDINATOR: "NOT_COORDINATOR",
    COORDINATOR_NOT_AVAILABLE: "COORDINATOR_NOT_AVAILABLE",
    COORDINATOR_LOAD_IN_PROGRESS: "COORDINATOR_LOAD_IN_PROGRESS",
}


def java_string_hash(text: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... + s[n-1], in UTF-16 code units, as int32."""
    units = array("H", text.encode("utf-16-le", "surrogatepass"))
    if array("H", b"\x01\x00")[0] != 1:  # big-endian host: the units were read swapped
        units.byteswap()
    h = 0
    for unit in units:
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def kafka_abs(value: int) -> int:
    """Kafka's Utils.abs: the absolute value, except Integer.MIN_VALUE gives 0."""
    return 0 if value == _INT_MIN else abs(value)


def partition_for(key: str, partitions: int = DEFAULT_PARTITIONS) -> int:
    """The coordinator partition of a group id or transactional id."""
    if partitions <= 0:
        raise ValueError(f"partitions must be positive, not {partitions}")
    return kafka_abs(java_string_hash(key)) % partitions
