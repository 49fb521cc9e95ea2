"""streamjoin: distributed, exact, windowed stream joins as Kafka-backed services. This folder
holds the command line (`cli`), the local launcher, the demo, logging setup and the shipped job
files; the benchmarks (`streamjoin.bench`) live in the top-level bench/ folder."""
