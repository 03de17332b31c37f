"""Kafka traffic as packet captures: writing pcapng recordings of the tunnel and reading
pcap/pcapng files (ours or tcpdump's) back into Kafka frames. Sans-I/O except recorder.py."""
