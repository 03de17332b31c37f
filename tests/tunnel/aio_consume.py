"""aiokafka, as an application in a container runs it: consume TOPIC from the start as each
GROUP (at once) until COUNT records, committing; prints `CONSUMED GROUP n` per group.

    python tests/tunnel/aio_consume.py BOOTSTRAP TOPIC COUNT GROUP [GROUP ...]"""

from __future__ import annotations

import asyncio
import sys

from aiokafka import AIOKafkaConsumer


async def consume(bootstrap: str, group: str, topic: str, count: int) -> int:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest"
    )
    await consumer.start()
    seen = 0
    try:
        async with asyncio.timeout(60):
            while seen < count:
                batches = await consumer.getmany(timeout_ms=500)
                seen += sum(len(records) for records in batches.values())
        await consumer.commit()
    finally:
        await consumer.stop()
    return seen


async def main(bootstrap: str, topic: str, count: int, groups: list[str]) -> None:
    done = await asyncio.gather(*(consume(bootstrap, g, topic, count) for g in groups))
    for group, seen in zip(groups, done, strict=True):
        print(f"CONSUMED {group} {seen}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]))
