"""Join state that outlives a batch: a hash worker's windows in RocksDB with their checkpoints,
changelog records and spill policy, and a SplitJoin core's changelog and restore."""
