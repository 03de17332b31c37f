"""kafkatunnel: reach a Kafka cluster inside Kubernetes from a laptop as if it were local."""

__version__ = "0.1.0"
