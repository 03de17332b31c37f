"""`verify --replay-against`: re-issue read-only look-ups for every group and transactional
id in the recordings through a live tunnel, as Spark tasks. Nothing is ever written: a
FindCoordinator, then, sent to the coordinator it named, an OffsetFetch of the group and a
Heartbeat as a member that cannot exist (DescribeTransactions for a transactional id, when
the broker has it). Only the coordinator answers these without NOT_COORDINATOR."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafkatunnel.probe import CLIENT_ID, ProbeConnection, find_coordinator
from kafkatunnel.protocol import COORDINATOR_ERRORS
from kafkatunnel.verify.events import TRANSACTION

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPLAY_CLIENT = f"{CLIENT_ID}-replay"


def replay_key(bootstrap: str, key: str, key_type: int, timeout: float = 10.0) -> dict[str, Any]:
    transactional = key_type == TRANSACTION
    result: dict[str, Any] = {
        "key": key,
        "kind": "transactional_id" if transactional else "group",
        "ok": False,
    }
    try:
        found = find_coordinator(bootstrap, key, transactional=transactional, timeout=timeout,
                                 client_id=REPLAY_CLIENT)  # fmt: skip
        result.update(coordinator=found.node_id, address=found.address)
        if found.error_code:
            result["error"] = COORDINATOR_ERRORS.get(found.error_code, found.error_code)
            return result
        with ProbeConnection(found.address, timeout, client_id=REPLAY_CLIENT) as connection:
            if transactional:
                error = connection.describe_transaction_error(key)
                result["checked_with"] = "DescribeTransactions" if error is not None else None
            else:
                error, result["checked_with"] = _group_error(connection, key)
    except (OSError, ValueError) as failure:
        result["error"] = f"{type(failure).__name__}: {failure}"
        return result
    if error is not None and error in COORDINATOR_ERRORS:
        result["error"] = COORDINATOR_ERRORS[error]
        return result
    result["ok"] = True
    return result


def _group_error(connection: ProbeConnection, group: str) -> tuple[int, str]:
    """OffsetFetch, then Heartbeat: the first coordinator error, and what was asked. An
    OffsetFetch answer that cannot be read leaves the check to the Heartbeat, and says so."""
    try:
        error = connection.offset_fetch_error(group)
        asked = "OffsetFetch, Heartbeat"
    except ConnectionError as failure:  # an answer no schema reads: not a verdict
        error, asked = 0, f"Heartbeat (the OffsetFetch answer could not be read: {failure})"
    if error in COORDINATOR_ERRORS:
        return error, asked
    return connection.heartbeat_error(group), asked


def replay(
    keys: list[tuple[str, int]], bootstrap: str, spark: SparkSession | None
) -> list[dict[str, Any]]:
    if spark is None:
        return [replay_key(bootstrap, key, key_type) for key, key_type in keys]
    tasks = spark.sparkContext.parallelize(keys, max(1, min(len(keys), 64)))
    return tasks.map(lambda item: replay_key(bootstrap, item[0], item[1])).collect()
