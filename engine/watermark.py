"""Watermarks that do not depend on fetch order.

The watermark is the minimum over every input of the newest event time seen on
it, minus the allowed lateness, and never moves back. An input is one
(stream, source partition) for the ring head, or one stream of a partition
group for the hash worker. Taking the maximum over a stream's partitions
instead would let one partition read ahead (a backlog, a paused partition,
uneven fetches) dead-letter on-time tuples of the others.

An input that has produced nothing holds the watermark at NO_TIME, unless
`idle_ms` is set and it has been silent that long (wall clock since its last
record, or since start): then it is left out of the minimum, as Kafka Streams'
max.task.idle.ms and Flink's idleness do. A record arriving on it later behind
the watermark is late by the usual rule. When every input is idle the
watermark holds (nothing says how far time has moved).
"""

from __future__ import annotations

import numpy as np

from streamjoin.engine.window_join import NO_TIME


class InputClock:
    """Newest event time and last-record wall time per input, per stream.

    Parameters: `inputs`, per stream the number of inputs it has (source partitions, or 1);
    `lateness_ms`, the allowed lateness; `idle_ms`, the idle timeout (None or 0: off);
    `now_ms`, the wall clock at start (an input's silence is counted from here)."""

    def __init__(self, inputs: list[int], lateness_ms: int, idle_ms: int | None, now_ms: int) -> None:
        self.newest = [np.full(n, NO_TIME, np.int64) for n in inputs]
        self.last_ms = [np.full(n, now_ms, np.int64) for n in inputs]
        self.lateness_ms, self.idle_ms = lateness_ms, idle_ms or 0
        self.watermark = NO_TIME

    def observe(self, stream: int, inputs: np.ndarray, ts: np.ndarray) -> None:
        """Accepted tuples of `stream`: `inputs[k]` is the input tuple k came on, `ts[k]` its event time."""
        if len(ts):
            np.maximum.at(self.newest[stream], inputs, ts)

    def touch(self, stream: int, inputs: np.ndarray, now_ms: int) -> None:
        """`inputs` of `stream` delivered records at `now_ms` (accepted or not): they are not idle."""
        self.last_ms[stream][inputs] = now_ms

    def hold(self, now_ms: int) -> None:
        """Reading stopped (backpressure): silence until `now_ms` is no sign of idleness."""
        for last in self.last_ms:
            last[:] = now_ms

    def advance(self, now_ms: int) -> int:
        """The watermark at `now_ms` (monotone): min over the non-idle inputs of their newest
        event time, minus the lateness; NO_TIME while a non-idle input has seen nothing."""
        low = self.low_newest(now_ms)
        if low is not None:
            self.watermark = max(self.watermark, low - self.lateness_ms)
        return self.watermark

    def idle_streams(self, now_ms: int) -> frozenset[int]:
        """Streams all of whose inputs are idle at `now_ms`."""
        return frozenset(i for i, last in enumerate(self.last_ms) if not self._active(last, now_ms).any())

    def low_newest(self, now_ms: int) -> int | None:
        """The min over non-idle inputs of the newest event time (None: one has seen nothing,
        or all are idle): what holds the watermark back."""
        lows = [newest[self._active(last, now_ms)] for newest, last in zip(self.newest, self.last_ms)]
        live = np.concatenate(lows) if lows else np.empty(0, np.int64)
        return int(live.min()) if len(live) and live.min() > NO_TIME else None

    def _active(self, last_ms: np.ndarray, now_ms: int) -> np.ndarray:
        if not self.idle_ms:
            return np.ones(len(last_ms), bool)
        return now_ms - last_ms < self.idle_ms
