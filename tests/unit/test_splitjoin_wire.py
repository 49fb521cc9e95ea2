"""SplitJoin's records and settings as hostile input: the core-release and mark
decoders raise only SplitJoinWireError whatever the bytes, round-trip what the
services write, and a bad splitjoin job or flag exits 2 naming what to fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from streamjoin.cli import app
from streamjoin.engine.block import Block
from streamjoin.engine.splitjoin.schedule import Schedule
from streamjoin.schemas.splitjoin import (CORE_HEADER, MARK_HEADER, CoreMeta, ScaleMark, SplitJoinWireError, TickMark,
                                          decode_core_release, encode_core_release, mark_headers, mark_of)
from streamjoin.schemas import splitjoin as wire
from tests.profiles import examples

runner = CliRunner()
headers = st.lists(st.tuples(st.sampled_from([CORE_HEADER, MARK_HEADER, "other"]),
                             st.one_of(st.binary(max_size=300), st.sampled_from([
                                 b'{"core":0,"from_g":0,"through":1,"schedule":[[0,1]]}',
                                 b'{"core":0,"from_g":5,"through":1,"schedule":[[0,1]]}',
                                 b'{"core":0,"from_g":0,"through":1,"schedule":[[3,1]]}',
                                 b'{"core":0,"from_g":0,"through":1,"schedule":[[0,0]],"piece":2,"pieces":1}',
                                 b'{"kind":"scale","id":"a","cores":0}', b'{"kind":"tick","ts":-5}',
                                 b'{"kind":"tick","ts":5}', b'[]', b'null']))), max_size=3)


@settings(max_examples=examples(400), deadline=None)
@given(value=st.one_of(st.none(), st.binary(max_size=2000)), hdrs=headers)
def test_core_release_decoder_raises_only_its_own_error(value: bytes | None, hdrs: list) -> None:
    try:
        meta, block = decode_core_release(value, hdrs)
    except SplitJoinWireError:
        return
    assert meta.through >= meta.from_g and meta.piece < meta.pieces
    assert isinstance(block, Block)


@settings(max_examples=examples(400), deadline=None)
@given(hdrs=headers)
def test_mark_decoder_raises_only_its_own_error(hdrs: list) -> None:
    try:
        mark = mark_of(hdrs)
    except SplitJoinWireError:
        return
    assert mark is None or isinstance(mark, (ScaleMark, TickMark))


def test_a_big_release_travels_in_pieces_and_comes_back_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "MAX_PIECE_BYTES", 1000)
    results = Block({"r._g": np.arange(500, dtype=np.int64), "s._g": np.arange(500, dtype=np.int64) + 1000})
    meta = CoreMeta(core=2, from_g=10, through=20, punctuation=16, schedule=[(0, 3), (15, 2)], switches=1)
    records = encode_core_release(meta, results)
    assert len(records) > 1
    decoded = [decode_core_release(v, h) for v, h in records]
    assert [m.piece for m, _ in decoded] == list(range(len(records)))
    assert np.array_equal(np.concatenate([b["r._g"] for _, b in decoded]), results["r._g"])
    assert decoded[0][0].to_schedule() == Schedule.fixed(3).switched(15, 2)


def test_marks_round_trip() -> None:
    assert mark_of(mark_headers(ScaleMark(id="m", cores=3))) == ScaleMark(id="m", cores=3)
    assert mark_of(mark_headers(TickMark(ts=99))) == TickMark(ts=99)
    assert mark_of([("other", b"x")]) is None


def _splitjoin_job(tmp_path: Path, **change: object) -> Path:
    data = yaml.safe_load(Path("streamjoin/jobs/band.yaml").read_text())
    data["join"]["mode"] = "splitjoin"
    for section, value in change.items():
        data[section] = value if not isinstance(value, dict) else data.get(section, {}) | value
    path = tmp_path / "splitjoin.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("change, words", [
    ({"join": {"mode": "splitjoin", "idle_timeout_ms": 1000}}, "join.idle_timeout_ms must be unset"),
    ({"splitjoin": {"cores": 5, "max_cores": 4}}, "splitjoin.cores (5) is above splitjoin.max_cores (4)"),
    ({"splitjoin": {"punctuate_every": -1}}, "punctuate_every"),
    ({"join": {"mode": "splitjoin", "predicate": [{"left": "r.x", "right": "s.zz", "within": 1}]}}, "s.zz names no field"),
])
def test_bad_splitjoin_job_exits_2(tmp_path: Path, change: dict, words: str) -> None:
    result = runner.invoke(app, ["worker", "--worker-id", "c0", "--core", "0", "--job",
                                 str(_splitjoin_job(tmp_path, **change)), "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split())


def test_a_three_way_splitjoin_job_exits_2(tmp_path: Path) -> None:
    data = yaml.safe_load(Path("streamjoin/jobs/band3.yaml").read_text())
    data["join"] = {k: v for k, v in data["join"].items() if k != "order"} | {"mode": "splitjoin"}
    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["merger", "--job", str(path), "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2 and "joins two streams" in " ".join(result.output.split()), result.output


@pytest.mark.parametrize("args, words", [
    (["worker", "--worker-id", "c9"], "--core"),
    (["worker", "--worker-id", "c9", "--core", "16"], "--core"),
    (["splitjoin", "scale", "--cores", "0"], "--cores must be 1..splitjoin.max_cores"),
    (["splitjoin", "scale", "--cores", "17"], "--cores must be 1..splitjoin.max_cores"),
    (["splitjoin", "tick", "--ts", "-3"], "--ts must be an epoch time"),
])
def test_bad_splitjoin_flags_exit_2(tmp_path: Path, args: list[str], words: str) -> None:
    result = runner.invoke(app, [*args, "--job", str(_splitjoin_job(tmp_path)), "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split())


def test_splitjoin_commands_refuse_other_modes() -> None:
    result = runner.invoke(app, ["splitjoin", "scale", "--cores", "2", "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2 and "needs join.mode: splitjoin" in " ".join(result.output.split()), result.output
