"""Every input kept under tests/fuzz/corpus/<target>/ (seeds, crashers the fuzzers
found, interesting inputs) replayed through its fuzz target (a decoder's, or `cql`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.targets import target

CORPUS = Path(__file__).resolve().parents[1] / "fuzz" / "corpus"
CASES = sorted((d.name, f) for d in CORPUS.iterdir() if d.is_dir() for f in d.iterdir() if f.is_file())


def test_every_decoder_has_a_corpus() -> None:
    assert {decoder for decoder, _ in CASES} == {"json", "json-fields", "avro", "blocks", "cql", "split"}


@pytest.mark.parametrize("decoder, path", CASES, ids=[f"{d}/{p.name}" for d, p in CASES])
def test_corpus_input_passes_its_target(decoder: str, path: Path) -> None:
    target(decoder)(path.read_bytes())
