"""SplitJoin mode (seed 001): the cores and the merger."""
