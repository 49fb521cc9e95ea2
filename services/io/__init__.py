"""Kafka's plumbing, shared by every mode: the clients and bounded reads (`kafka`), the one
transaction object and the process's hard exit (`transactions`), delivery reports and the
checked flush (`deliveries`), decoding polled records into per-group blocks (`intake`, with
the progress notes' wire format in `progress_notes`), the one result writer (`results`), dead
letters (`dead_letters`) and what every mode builds from a job's streams (`templates`).
Nothing here imports a mode (hash, ring, splitjoin, queries, coordinator, spark)."""
