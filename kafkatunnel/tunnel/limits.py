"""The tunnel's default limits, in a module of their own: `up --help` shows them without
loading the tunnel."""

# A cluster with more brokers than this is rare; an answer naming more is more likely a
# broken or hostile one. Each broker costs a listener (two with DNS) and, via kubectl, a
# port-forward process. --max-brokers raises it.
DEFAULT_MAX_BROKERS = 256
# Each client connection holds two descriptors, up to a frame's worth of memory and, with
# --via exec, a process: past this many at once, new ones are closed at accept.
DEFAULT_MAX_CONNECTIONS = 1024
