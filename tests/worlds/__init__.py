"""The worlds the tests and the benchmarks run the tunnel in, beyond the demo's cluster
(kafkatunnel.demo): Apache Kafka with Strimzi's TLS, SCRAM, mutual-TLS and OAuth listeners
and the certificate authorities behind them, Keycloak, a real one-node Kubernetes with
Strimzi's layout of a Kafka cluster in its pods, and recordings made from recorded sessions.
None of it ships with kafkatunnel (tests/test_wheel.py)."""
