"""The suite's own check (tests/conftest.py, no_task_dies_unobserved): a child of ours that
prints asyncio's "Task exception was never retrieved" is seen, with what followed it, once."""

from __future__ import annotations

import sys

from kafkatunnel.demo.processes import ManagedProcess, unobserved_task_errors
from kafkatunnel.waiting import wait_for

PRINTS = (
    "import asyncio\n"
    "async def dies():\n"
    "    raise RuntimeError('the handler is closed')\n"
    "async def main():\n"
    "    asyncio.get_running_loop().create_task(dies())\n"
    "    await asyncio.sleep(0.1)\n"
    "asyncio.run(main())\n"
    "print('done', flush=True)\n"
)


def test_a_child_whose_task_died_unobserved_is_told_with_its_traceback() -> None:
    process = ManagedProcess([sys.executable, "-c", PRINTS], name="dying task")
    try:
        wait_for(lambda: not process.alive(), timeout=30, what="the child to end")
        process.stop()
        told = unobserved_task_errors()
    finally:
        process.stop()
    assert len(told) == 1, told
    assert told[0].startswith("dying task:\nTask exception was never retrieved"), told
    assert "RuntimeError: the handler is closed" in told[0], told
    assert unobserved_task_errors() == []  # told once
