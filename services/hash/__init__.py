"""Hash-partitioned mode: the join worker (`main`) that owns partition groups, its cycle
(`processor`), what it writes in a cycle's transaction (`emit`), its recovery and restore
from Kafka, progress notes across the repartition, event-time alignment and idle streams
(`pacing`, `alignment`), and its heartbeat (`heartbeat`, `backlog`)."""
