"""Topics and partitioning: the topic plan, creation and `topics check` (`topics`), Kafka's murmur2
partitioner (`partitioner`), and the continuous-query operator sharing planner (`reuse`)."""
