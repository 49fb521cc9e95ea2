"""The peers every workload is measured against, each reading the same input
as our workers in the same run: Spark Structured Streaming (`spark_peer`),
one raw Kafka consumer (`kafka_consume`, the physical limit) and the
plain-Python reference join (`reference`, the floor). Each takes the job and
the exported input tables, not a workload, so band and psp reuse them."""
