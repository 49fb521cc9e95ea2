"""Tombstones of an as-of join's table (services/io/tombstones.py): a null value becomes the
deletion of the row its record key spells, at its Kafka timestamp; a key that spells no row
exactly leaves the record null, for the decoder to dead-letter. Any key bytes at all: no
exception, and every key text streamjoin's producers write reads back to its values."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from streamjoin.schemas.join_keys import key_text
from streamjoin.services.io.tombstones import as_rows, key_fields
from streamjoin.settings import StreamSpec
from tests.profiles import examples

pytestmark = pytest.mark.unit


def spec(keys: dict[str, str]) -> StreamSpec:
    return StreamSpec(name="customers", fields={"ts": "int", "tier": "int", "note": "str", **keys},
                      time_field="ts", key_fields=list(keys))


def test_a_null_value_becomes_its_keys_deleted_row_at_the_record_time() -> None:
    s = spec({"customer": "int"})
    values, deleted = as_rows(s, [b'{"ts": 5, "customer": 1, "tier": 2, "note": "x"}', None, None, None],
                              [b"1", b"42", b"+42", None], np.array([9, 10, 11, 12]))
    assert deleted.tolist() == [False, True, True, True]
    assert values[0].startswith(b'{"ts": 5')
    assert json.loads(values[1]) == {"ts": 10, "tier": 0, "note": "", "customer": 42}
    assert values[2] is None and values[3] is None  # "+42" is no int's key text; no key at all


def test_several_key_fields_and_their_types() -> None:
    s = spec({"region": "str", "vip": "bool", "customer": "int"})
    assert key_fields(s, b"east,true,7") == {"region": "east", "vip": True, "customer": 7}
    for bad in (b"east,true", b"east,yes,7", b"east,true,7,8", b"\xff,true,7", b"east,true,07"):
        assert key_fields(s, bad) is None, bad


@hsettings(max_examples=examples(300), deadline=None)
@given(region=st.text(alphabet=st.characters(blacklist_characters=",\x00", blacklist_categories=("Cs",))),
       vip=st.booleans(), customer=st.integers(-2**63, 2**63 - 1), junk=st.binary(max_size=40))
def test_producers_key_texts_read_back_and_any_bytes_are_survived(region: str, vip: bool, customer: int,
                                                                  junk: bytes) -> None:
    s = spec({"region": "str", "vip": "bool", "customer": "int"})
    text = key_text([(np.array([region]), "str"), (np.array([vip]), "bool"),
                     (np.array([customer], np.int64), "int")]).to_pylist()[0]
    assert key_fields(s, text) == {"region": region, "vip": vip, "customer": customer}
    found = key_fields(s, junk)  # never raises; when it reads a row, that row spells the same key
    if found is not None:
        again = key_text([(np.array([found["region"]]), "str"), (np.array([found["vip"]]), "bool"),
                          (np.array([found["customer"]], np.int64), "int")]).to_pylist()[0]
        assert again == junk
