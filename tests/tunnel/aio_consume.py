"""aiokafka, as an application in a container runs it: consume TOPIC as GROUP until COUNT
records, committing; prints `CONSUMED n`.

    python tests/tunnel/aio_consume.py BOOTSTRAP GROUP TOPIC COUNT"""

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


if __name__ == "__main__":
    bootstrap, group, topic, count = sys.argv[1:5]
    print(f"CONSUMED {asyncio.run(consume(bootstrap, group, topic, int(count)))}", flush=True)
