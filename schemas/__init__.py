"""Record formats on the wire, pure: input codecs (JSON, Avro, Arrow IPC blocks), result records,
commit, control, ring and SplitJoin records, join-key text, and the continuous-query language."""
