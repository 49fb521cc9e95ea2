"""The processes: Kafka's plumbing (`io`), one folder per join mode (`hash`, `ring`, `splitjoin`),
the coordinator, the continuous-query service, the Spark jobs, and what they share (metrics,
shutdown, faults, workloads, the embedded broker)."""
