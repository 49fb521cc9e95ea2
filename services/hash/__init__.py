"""Hash-partitioned mode: the join worker (`main`) that owns partition groups, its cycle
top-down (`cycle`), the join of a cycle's batches (`processor`), the cycle's writers
(`emit`), its recovery and restore from Kafka, progress notes across the repartition,
event-time alignment and idle streams (`pacing`, `alignment`), and its heartbeat
(`heartbeat`, `backlog`)."""
