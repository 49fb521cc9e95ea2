"""The join engine, pure (no Kafka, no clock of its own): blocks of columns and the windowed
joins of one partition group (hash mode), the PSP ring's engine (psp/), SplitJoin's cores and
merger ordering (splitjoin/), predicates and UDFs, late tuples, result ids, and the numba
kernels under them."""
