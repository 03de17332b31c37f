"""What runs as root under `sudo up --dns`, tested without root: the check that the user
can read the installation before root is dropped."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import sysconfig
from pathlib import Path

import kafkatunnel


def test_a_library_directory_python_never_made_does_not_stop_sudo(tmp_path: Path) -> None:
    """A fresh Debian names /usr/local/lib/python3.X/dist-packages as its purelib before
    anything was installed there. Played by a virtualenv whose site-packages is gone: the
    check of what the user can read looks at what exists and is used, and passes."""
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    Path(purelib).rmdir()  # empty: made by venv, nothing installed
    me = pwd.getpwuid(os.getuid())
    source = Path(kafkatunnel.__file__).parent.parent
    dependencies = sysconfig.get_path("purelib")  # this test's own, for kafkatunnel's imports
    check = (
        "import sys, sysconfig; from kafkatunnel.privileges import User, unreadable_installation;"
        "print(sysconfig.get_path('purelib'));"
        f"print(unreadable_installation(User({me.pw_uid}, {me.pw_gid}, {me.pw_name!r}, '/')))"
    )
    result = subprocess.run(
        [python, "-c", check], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(source), dependencies])},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    named, unreadable = result.stdout.splitlines()
    assert named == purelib and not Path(named).exists()
    assert unreadable == "None"
