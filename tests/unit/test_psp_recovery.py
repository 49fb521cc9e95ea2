"""engine/psp/recovery.py's pieces on their own: runs of `_sseq`, membership, which logged
rounds a log written by several epochs holds, and the order logged rounds are released again."""

from __future__ import annotations

import numpy as np
from hypothesis import given, strategies as st

from streamjoin.engine.psp.messages import Probe, RoundInfo
from streamjoin.engine.psp.recovery import LoggedRound, Redrive, in_runs, runs_of, valid_rounds


@given(st.sets(st.integers(0, 200), max_size=60), st.lists(st.integers(-5, 210), max_size=40))
def test_runs_hold_exactly_the_values_they_were_made_of(values: set[int], probes: list[int]) -> None:
    runs = runs_of(np.array(sorted(values), np.int64))
    assert all(a < b for a, b in runs) and all(b < c for (_, b), (c, _) in zip(runs, runs[1:]))  # disjoint, apart
    queried = np.array(probes, np.int64)
    assert in_runs(queried, runs).tolist() == [p in values for p in probes]


def _logged(epoch: int, rnd: int, done_below: int | None = None) -> LoggedRound:
    info = RoundInfo(rnd, ("n0",), {"n0": (1.0,)}, 0, (0,), 0, rnd if done_below is None else done_below, ((),), 0)
    return LoggedRound(epoch, Probe(info, ()), {"epoch": epoch})


def test_a_later_epoch_supersedes_what_older_ones_logged_from_its_round_on() -> None:
    log = [_logged(0, 5), _logged(0, 6), _logged(0, 7), _logged(1, 7), _logged(0, 8), _logged(1, 8), _logged(1, 9)]
    ran = valid_rounds(log, after_round=5)
    assert [(r.epoch, r.round) for r in ran] == [(0, 5), (0, 6), (1, 7), (1, 8), (1, 9)]
    assert [r.round for r in valid_rounds(log, after_round=7)] == [7, 8, 9]
    assert valid_rounds([_logged(0, 6)], after_round=5) == []  # a gap: nothing after it is trusted


def test_logged_rounds_go_again_only_once_those_below_their_done_below_ended() -> None:
    redrive = Redrive([_logged(0, 3, done_below=2), _logged(0, 4, done_below=3), _logged(0, 5, done_below=5)])
    assert redrive.ready(in_flight={1}) is None  # round 3 was first released once round 1 had ended
    assert redrive.ready(in_flight={2}).round == 3  # ... while round 2 was still open
    assert redrive.ready(in_flight={3}).round == 4  # 4 was first released while 3 was open
    assert redrive.ready(in_flight={3, 4}) is None  # 5 was released after 3 and 4 had ended
    assert redrive.ready(in_flight=set()).round == 5 and not redrive
