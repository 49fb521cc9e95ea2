"""Kafka's murmur2 partitioner (topology/partitioner.py) and the join-key text it
hashes (schemas/join_keys.py): the scalar reference against Kafka's own test
vectors, and the whole-block versions (`key_text`, `murmur2_many`,
`partitions_for_keys`) against the scalar reference for every input."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.schemas.join_keys import key_bytes, key_text
from streamjoin.topology.partitioner import murmur2, murmur2_many, partition_for, partitions_for_keys
from tests.profiles import examples

# Kafka's clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java testMurmur2, and the
# values Akka's Murmur2Spec took from Kafka's implementation.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
    b"1": -1993445489,
    b"12": 126087238,
    b"123": -267702483,
    b"1234": -1614185708,
    b"12345": -1188365604,
}
INT64 = st.integers(-(2**63), 2**63 - 1)
# Surrogate-free text (Arrow holds UTF-8); NUL excluded at the end only, where NumPy 'U' would drop it.
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12).filter(lambda s: not s.endswith("\0"))


def test_scalar_murmur2_matches_kafkas_test_vectors() -> None:
    assert {k: murmur2(k) for k in KAFKA_VECTORS} == KAFKA_VECTORS


def test_vectorised_murmur2_matches_kafkas_test_vectors() -> None:
    assert murmur2_many(list(KAFKA_VECTORS)).tolist() == list(KAFKA_VECTORS.values())


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=300), max_size=40))
def test_vectorised_murmur2_equals_the_scalar_one(keys: list[bytes]) -> None:
    got = murmur2_many(keys)
    assert got.dtype == np.int32
    assert got.tolist() == [murmur2(k) for k in keys]


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=30), st.data())
def test_murmur2_reads_sliced_string_and_large_arrow_arrays(keys: list[bytes], data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(keys)))
    expected = [murmur2(k) for k in keys[start:]]
    assert murmur2_many(pa.array(keys, pa.binary())[start:]).tolist() == expected
    assert murmur2_many(pa.array(keys, pa.large_binary())[start:]).tolist() == expected
    texts = [k.decode("latin-1") for k in keys]  # any bytes -> valid text; hash its UTF-8
    assert murmur2_many(pa.array(texts, pa.string())[start:]).tolist() == [murmur2(t.encode()) for t in texts[start:]]


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.binary(max_size=30), max_size=30), st.integers(1, 1000))
def test_partitions_are_kafkas_default_partitioner(keys: list[bytes], partitions: int) -> None:
    got = partitions_for_keys(keys, partitions)
    assert got.dtype == np.int32
    assert got.tolist() == [partition_for(k, partitions) for k in keys]


def _scalar_key_text(row: tuple, types: list[str]) -> bytes:
    """The spec's rule, one row at a time."""
    return b",".join(key_bytes(v) if t != "str" else v.encode() for v, t in zip(row, types))


FIELD = st.sampled_from(["int", "str", "bool"])
VALUES = {"int": INT64, "str": TEXT, "bool": st.booleans()}
DTYPES = {"int": np.int64, "str": str, "bool": np.bool_}


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(FIELD, min_size=1, max_size=3), st.integers(0, 20), st.data())
def test_key_text_is_the_canonical_text_of_every_row(types: list[str], n: int, data: st.DataObject) -> None:
    columns = [np.array(data.draw(st.lists(VALUES[t], min_size=n, max_size=n)), dtype=DTYPES[t]) for t in types]
    got = key_text(list(zip(columns, types)))
    assert got.type == pa.large_binary()
    rows = list(zip(*(c.tolist() for c in columns))) if n else []
    assert got.to_pylist() == [_scalar_key_text(r, types) for r in rows]
    assert partitions_for_keys(got, 60).tolist() == [partition_for(_scalar_key_text(r, types), 60) for r in rows]


def test_key_text_spells_ints_bools_and_strings_as_the_spec_says() -> None:
    got = key_text([(np.array([-(2**63), 0, 2**63 - 1]), "int"), (np.array([True, False, True]), "bool"),
                    (np.array(["a,b", "é", ""]), "str")])
    assert got.to_pylist() == [b"-9223372036854775808,true,a,b", b"0,false,\xc3\xa9",
                               b"9223372036854775807,true,"]


@pytest.mark.parametrize("ftype", ["float", "bytes"])
def test_key_text_refuses_types_hash_mode_cannot_join_on(ftype: str) -> None:
    with pytest.raises(ValueError, match="int, str or bool"):
        key_text([(np.array([1.0]), ftype)])


def test_a_null_key_has_no_partition() -> None:
    with pytest.raises(ValueError, match="null key"):
        murmur2_many(pa.array([b"a", None], pa.binary()))


def test_empty_inputs_give_empty_outputs() -> None:
    assert murmur2_many([]).tolist() == []
    assert partitions_for_keys(key_text([(np.empty(0, np.int64), "int")]), 7).tolist() == []
