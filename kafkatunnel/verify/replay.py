"""`verify --replay-against`: re-issue read-only look-ups for every group and transactional
id in the recordings through a live tunnel, as Spark tasks. Nothing is ever written: a
FindCoordinator, then, sent to the coordinator it named, an OffsetFetch of the group and a
Heartbeat as a member that cannot exist (DescribeTransactions for a transactional id, when
the broker has it). Only the coordinator answers these without NOT_COORDINATOR."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafkatunnel.probe import ProbeConnection, find_coordinator
from kafkatunnel.protocol.coordinator import COORDINATOR_ERRORS
from kafkatunnel.verify.events import TRANSACTION

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def replay_key(bootstrap: str, key: str, key_type: int, timeout: float = 10.0) -> dict[str, Any]:
    transactional = key_type == TRANSACTION
    result: dict[str, Any] = {
        "key": key,
        "kind": "transactional_id" if transactional else "group",
        "ok": False,
    }
    try:
        found = find_coordinator(bootstrap, key, transactional=transactional, timeout=timeout)
        result.update(coordinator=found.node_id, address=found.address)
        if found.error_code:
            result["error"] = COORDINATOR_ERRORS.get(found.error_code, found.error_code)
            return result
        with ProbeConnection(found.address, timeout) as connection:
            if transactional:
                error = connection.describe_transaction_error(key)
                result["checked_with"] = "DescribeTransactions" if error is not None else None
            else:
                error = connection.offset_fetch_error(key)
                if error not in COORDINATOR_ERRORS:
                    error = connection.heartbeat_error(key)
                result["checked_with"] = "OffsetFetch, Heartbeat"
    except (OSError, ValueError) as failure:
        result["error"] = f"{type(failure).__name__}: {failure}"
        return result
    if error is not None and error in COORDINATOR_ERRORS:
        result["error"] = COORDINATOR_ERRORS[error]
        return result
    result["ok"] = True
    return result


def replay(
    keys: list[tuple[str, int]], bootstrap: str, spark: SparkSession | None
) -> list[dict[str, Any]]:
    if spark is None:
        return [replay_key(bootstrap, key, key_type) for key, key_type in keys]
    tasks = spark.sparkContext.parallelize(keys, max(1, min(len(keys), 64)))
    return tasks.map(lambda item: replay_key(bootstrap, item[0], item[1])).collect()
