"""Pipelined State Partitioning (PSP): the ring's engine, free of Kafka.

messages.py  what travels between ring nodes (rounds, builds, probes, partials, END)
slices.py    one node's time slice of every stream's window, with round visibility
probe.py     vectorised theta probing of a partial block against one slice
node.py      a node's reaction to each message (insert, cross-purge, propagate, probe)
head.py      the head's release of rounds by watermark and its slice bounds
cost_model.py  equations 1-6 of the PSP paper
"""
