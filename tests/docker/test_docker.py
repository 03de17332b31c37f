"""The recipes of docs/containers.md, run for real with Docker: the docker compose file with
Compose, the devcontainer.json with the devcontainer CLI, and `--container-network NAME` on
a network made with `docker network create`. The application in each container
(tests/docker/orders.py) consumes with a group on every coordinator of the cluster, through
`up --for-containers` on the bridge Docker made. The recipes' image is replaced by the
Debian image imported here, which mounts this checkout's Python read-only to run its
client; everything else is the recipe as the document gives it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.demo.processes import ManagedProcess
from tests.docker.conftest import DEVCONTAINER, ROOT, Docker
from tests.tunnel.test_containers import listening_addresses

RECIPES = ROOT / "docs" / "containers.md"
ORDERS = ROOT / "tests" / "docker" / "orders.py"
MESSAGES = 20
HOST_NAME = "host.docker.internal"


def recipe(heading: str, language: str) -> str:
    """The first `language` block under `heading` in docs/containers.md."""
    section = RECIPES.read_text().split(f"\n{heading}\n", 1)[1]
    found = re.search(rf"^```{language}\n(.*?)^```", section, re.S | re.M)
    assert found is not None, (heading, language)
    return found[1]


@contextmanager
def for_containers(
    cluster: LocalCluster, docker: Docker, *flags: str
) -> Iterator[tuple[ManagedProcess, str]]:
    """`up --for-containers FLAGS` in front of the cluster; yields it and the
    bootstrap.servers it prints for containers."""
    up = ManagedProcess(
        [sys.executable, "-m", "kafkatunnel", "up", "--no-table",
         "--bootstrap", cluster.mock[0].address, "--exec", cluster.exec_template(),
         "--listen", f"127.0.0.1:{free_port_run(8)}", "--for-containers", *flags],
        name="kafkatunnel-up-docker", env=docker.env,
    )  # fmt: skip
    try:
        yield up, up.wait_for_line(r"^containers: bootstrap\.servers=(\S+)$", timeout=60)[1]
    finally:
        up.stop()
    assert "Traceback" not in up.output(), up.output()[-3000:]


def groups_everywhere(cluster: LocalCluster, topic: str) -> list[str]:
    """A group coordinated by each broker."""
    spread = cluster.groups_by_coordinator(1, prefix=f"{topic}-g")
    assert len(spread) == len(cluster.mock), spread
    return [group for (group,) in spread.values()]


def consumed_everywhere(output: str, groups: list[str]) -> None:
    """The application consumed every message with each group, without NOT_COORDINATOR."""
    said = re.findall(r"CONSUMED (\S+) (\d+) NOT_COORDINATOR (\d+)", output)
    assert said == [(group, str(MESSAGES), "0") for group in groups], output[-3000:]


def test_the_compose_recipe_consumes_with_groups_on_every_coordinator(
    cluster: LocalCluster, docker: Docker, tmp_path: Path
) -> None:
    """`up --for-containers --advertise host.docker.internal` and `docker compose up`, with
    the compose file as docs/containers.md gives it (Compose's own network, the host named
    by Docker's host-gateway)."""
    topic = f"compose-{uuid.uuid4().hex[:6]}"
    groups = groups_everywhere(cluster, topic)
    compose: dict[str, Any] = yaml.safe_load(recipe("## docker compose", "yaml"))
    orders = compose["services"]["orders"]
    assert orders["extra_hosts"] == [f"{HOST_NAME}:host-gateway"]
    project = f"kt{uuid.uuid4().hex[:8]}"
    with for_containers(cluster, docker, "--advertise", HOST_NAME) as (_, inside):
        assert inside.startswith(f"{HOST_NAME}:"), inside
        assert orders["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == f"{HOST_NAME}:9092"
        orders["environment"]["KAFKA_BOOTSTRAP_SERVERS"] = inside  # the port up chose
        command = [sys.executable, str(ORDERS), topic, str(MESSAGES), *groups]
        orders |= {"image": docker.image, "volumes": docker.volumes(), "command": command}
        (tmp_path / "docker-compose.yml").write_text(yaml.safe_dump(compose))
        compose_run = ["docker-compose", "--project-name", project]
        try:
            ran = subprocess.run([*compose_run, "up", "--exit-code-from", "orders"],
                                 capture_output=True, text=True, timeout=300, cwd=tmp_path,
                                 env=docker.env)  # fmt: skip
        finally:
            subprocess.run([*compose_run, "down"], capture_output=True, timeout=120,
                           cwd=tmp_path, env=docker.env)  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert f"PRODUCED {MESSAGES}" in ran.stdout, ran.stdout[-3000:]
    consumed_everywhere(ran.stdout, groups)


def test_the_devcontainer_recipe_consumes_with_groups_on_every_coordinator(
    cluster: LocalCluster, docker: Docker, tmp_path: Path
) -> None:
    """The devcontainer.json of docs/containers.md, started by the devcontainer CLI, its
    application run with `devcontainer exec`."""
    topic = f"devcontainer-{uuid.uuid4().hex[:6]}"
    groups = groups_everywhere(cluster, topic)
    config: dict[str, Any] = json.loads(recipe("## devcontainer", "json"))
    assert config["runArgs"] == [f"--add-host={HOST_NAME}:host-gateway"]
    workspace = tmp_path / "orders"
    (workspace / ".devcontainer").mkdir(parents=True)
    cli = str(DEVCONTAINER / "devcontainer")
    with for_containers(cluster, docker, "--advertise", HOST_NAME) as (_, inside):
        config["containerEnv"]["KAFKA_BOOTSTRAP_SERVERS"] = inside
        config |= {"image": docker.image,
                   "mounts": [f"source={p},target={p},type=bind,readonly" for p in
                              docker.shared()]}  # fmt: skip
        (workspace / ".devcontainer" / "devcontainer.json").write_text(json.dumps(config))
        try:
            started = subprocess.run([cli, "up", "--workspace-folder", str(workspace)],
                                     capture_output=True, text=True, timeout=300,
                                     env=docker.env)  # fmt: skip
            assert '"outcome":"success"' in started.stdout, started.stdout + started.stderr
            ran = subprocess.run(
                [cli, "exec", "--workspace-folder", str(workspace), sys.executable,
                 str(ORDERS), topic, str(MESSAGES), *groups],
                capture_output=True, text=True, timeout=300, env=docker.env,
            )  # fmt: skip
        finally:
            label = f"devcontainer.local_folder={workspace}"
            made = docker("ps", "-aq", "--filter", f"label={label}").stdout.split()
            if made:
                docker("rm", "-f", *made)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    consumed_everywhere(ran.stdout, groups)


def test_container_network_names_a_user_defined_network(
    cluster: LocalCluster, docker: Docker
) -> None:
    """`--container-network NAME` for a network made with `docker network create`: up asks
    Docker for its bridge, listens on its gateway and on loopback only, and a container on
    that network consumes at the printed address."""
    topic = f"network-{uuid.uuid4().hex[:6]}"
    groups = groups_everywhere(cluster, topic)
    network = f"kt-shop-{uuid.uuid4().hex[:6]}"
    made = docker("network", "create", network)
    assert made.returncode == 0, made.stderr
    try:
        gateway = docker("network", "inspect", "--format",
                         "{{(index .IPAM.Config 0).Gateway}}", network).stdout.strip()  # fmt: skip
        with for_containers(cluster, docker, "--container-network", network) as (up, inside):
            assert inside.split(":")[0] == gateway, (inside, gateway)
            assert listening_addresses(up.pid) == {"127.0.0.1", gateway}
            ran = docker("run", "--rm", "--network", network, "-e",
                         f"KAFKA_BOOTSTRAP_SERVERS={inside}",
                         *[f"--volume={v}" for v in docker.volumes()], docker.image,
                         sys.executable, str(ORDERS), topic, str(MESSAGES), *groups,
                         timeout=300)  # fmt: skip
            bridge = f"br-{made.stdout.strip()[:12]}"
            assert f"containers on bridge {bridge} reach the tunnel at {gateway}" in " ".join(
                up.output().split()
            )
    finally:
        docker("network", "rm", network)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    consumed_everywhere(ran.stdout, groups)
