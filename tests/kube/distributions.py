"""The pods of the common Kafka distributions, as their operators label and name them
(Strimzi 0.4x node pools and ZooKeeper clusters, Bitnami chart 31, CFK 2.x): the brokers (one
per mock broker, on its port) and the pods that carry the same labels without being brokers."""

from __future__ import annotations

from typing import Any

from kafkatunnel.demo import LocalCluster

DISTRIBUTIONS = ("strimzi-kraft", "strimzi-zookeeper", "bitnami", "confluent")

OTHER_PORT = 9090  # ports of pods that are not brokers: no broker advertises them


def distribution_pods(cluster: LocalCluster, distribution: str) -> list[dict[str, Any]]:
    """The distribution's pods, brokers and not."""
    ports = [b.port for b in cluster.mock]

    def pod(name: str, labels: dict[str, str], port: int, **extra: Any) -> dict[str, Any]:
        return {"name": name, "ip": "127.0.0.1", "ports": [port], "labels": labels, **extra}

    if distribution == "strimzi-kraft":
        base = {"strimzi.io/kind": "Kafka", "strimzi.io/cluster": "my-cluster",
                "app.kubernetes.io/name": "kafka"}  # fmt: skip
        controllers = [pod(f"my-cluster-controllers-{i}", {**base, "strimzi.io/name":
                           "my-cluster-kafka", "strimzi.io/broker-role": "false",
                           "strimzi.io/controller-role": "true"}, OTHER_PORT)
                       for i in range(3)]  # fmt: skip
        brokers = [pod(f"my-cluster-brokers-{i + 3}", {**base, "strimzi.io/name":
                       "my-cluster-kafka", "strimzi.io/broker-role": "true",
                       "strimzi.io/controller-role": "false"}, port)
                   for i, port in enumerate(ports)]  # fmt: skip
        operator = pod("my-cluster-entity-operator-5d7c", {"strimzi.io/kind": "Kafka",
                       "strimzi.io/name": "my-cluster-entity-operator"}, OTHER_PORT)  # fmt: skip
        return controllers + brokers + [operator]
    if distribution == "strimzi-zookeeper":
        kafka = {"strimzi.io/kind": "Kafka", "strimzi.io/name": "my-cluster-kafka",
                 "app.kubernetes.io/name": "kafka"}  # fmt: skip
        zookeeper = {"strimzi.io/kind": "Kafka", "strimzi.io/name": "my-cluster-zookeeper",
                     "app.kubernetes.io/name": "zookeeper"}  # fmt: skip
        brokers = [pod(f"my-cluster-kafka-{i}", kafka, port) for i, port in enumerate(ports)]
        return brokers + [pod(f"my-cluster-zookeeper-{i}", zookeeper, 2181) for i in range(3)]
    if distribution == "bitnami":
        labels = {"app.kubernetes.io/name": "kafka", "app.kubernetes.io/instance": "kafka"}
        controllers = [
            pod(
                f"kafka-controller-{i}",
                {**labels, "app.kubernetes.io/component": "controller-eligible"},
                OTHER_PORT,
                env={"KAFKA_CFG_PROCESS_ROLES": "controller"},
            )
            for i in range(3)
        ]
        brokers = [pod(f"kafka-broker-{i}", {**labels, "app.kubernetes.io/component": "broker"},
                       port, env={"KAFKA_CFG_PROCESS_ROLES": "broker"})
                   for i, port in enumerate(ports)]  # fmt: skip
        return controllers + brokers
    assert distribution == "confluent"
    kraft = [pod(f"kraftcontroller-{i}", {"app": "kraftcontroller", "type": "kraftcontroller",
                 "platform.confluent.io/type": "kraftcontroller"}, OTHER_PORT)
             for i in range(3)]  # fmt: skip
    brokers = [pod(f"kafka-{i}", {"app": "kafka", "type": "kafka",
                   "platform.confluent.io/type": "kafka"}, port)
               for i, port in enumerate(ports)]  # fmt: skip
    return kraft + brokers
