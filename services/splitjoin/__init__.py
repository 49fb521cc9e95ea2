"""SplitJoin mode: the cores (`core`) and the merger (`merger`, reading the cores' output
through `merger_intake`)."""
