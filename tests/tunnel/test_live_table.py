"""`kafkatunnel up` in a real terminal (tmux) shows the live table: read back from the screen."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.waiting import wait_for

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


def test_live_table_on_a_terminal(cluster: LocalCluster, tmp_path: Path) -> None:
    session = f"kt-{uuid.uuid4().hex[:8]}"
    port = free_port_run(8)
    command = " ".join(
        [
            f"KAFKATUNNEL_STATE_DIR={tmp_path}", sys.executable, "-m", "kafkatunnel", "up",
            "--bootstrap", cluster.mock[0].address, "--via", "exec",
            "--exec", f"'{cluster.exec_template()}'", "--listen", f"127.0.0.1:{port}",
        ]
    )  # fmt: skip
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "30"], check=True
    )
    subprocess.run(["tmux", "resize-window", "-t", session, "-x", "160", "-y", "30"], check=True)
    subprocess.run(["tmux", "send-keys", "-t", session, command, "Enter"], check=True)
    try:

        def screen() -> str:
            return subprocess.run(
                ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
            ).stdout

        def table_shown() -> str | None:
            text = screen()
            rows = [line for line in text.splitlines() if "127.0.0.1:" in line and " ok " in line]
            return text if len(rows) >= 4 else None  # the bootstrap and three brokers

        try:
            text = wait_for(table_shown, timeout=30, what="the live table on the tmux screen")
        except TimeoutError:
            raise AssertionError("the screen showed:\n" + screen()) from None
        assert f"bootstrap.servers=127.0.0.1:{port}" in text
        for column in ("node", "advertised", "tunnel", "forward", "conns", "errors"):
            assert column in text
        for offset in (1, 2, 3):
            assert f"127.0.0.1:{port + offset}" in text
        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)
        wait_for(
            lambda: (
                subprocess.run(["tmux", "has-session", "-t", session]).returncode != 0
                or "tunnel closed" in screen()
            ),
            timeout=15,
            what="Ctrl-C to close the tunnel",
        )
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
