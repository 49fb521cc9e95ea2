"""Python's cyclic garbage collector, set for services whose loop allocates tens of thousands
of short-lived objects per call.

confluent-kafka's `consume()` returns one `Message` per record, and Messages are tracked by the
collector. Under the default thresholds (700, 10, 10) a 40k-record call runs dozens of young
collections, and the records it keeps alive until they are taken into columns get promoted,
which soon triggers full collections over every object the process holds: the interpreter,
NumPy, Arrow, PySpark's modules. Profiled on a backlog drain, that was about a fifth of the
worker's main thread. None of these objects form cycles, so the work finds nothing.

`settle()` is called once, after a service's imports: everything alive then is frozen (never
traversed again; it lives as long as the process anyway), and the young generation is made
larger than one consume() call, so a collection runs per few calls, over what they left.
Cycles are still collected: the collector runs, only less often and over less.
"""

from __future__ import annotations

import gc

# Tracked allocations (net of frees) before a young collection: above one consume() call's
# records (worker.max_batch_records), so a call's Messages are freed before they are traversed.
YOUNG_THRESHOLD = 100_000
# Young collections per middle one, and middle ones per full one (the defaults are 10 and 10).
OLDER_THRESHOLDS = (10, 10)


def settle() -> None:
    """Collect once, freeze what is left, and raise the young generation's threshold."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
