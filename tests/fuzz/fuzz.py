"""Coverage-guided fuzzing of a record decoder, or of the query parser (`cql`), with
atheris (libFuzzer).

    python tests/fuzz/fuzz.py json|json-fields|avro|blocks|cql|split [libFuzzer flags] [corpus dirs]

e.g. `python tests/fuzz/fuzz.py json -max_total_time=300 tests/fuzz/corpus/json`.
Crashers land in the working directory (crash-*); a decoder bug found this way goes
into tests/fuzz/corpus/<decoder>/ once fixed, where tests/unit/test_fuzz_corpus.py
replays it. tests/unit/test_fuzz_bounded.py runs each target briefly in CI.
"""

from __future__ import annotations

import sys

import atheris

# Heavy dependencies first, uninstrumented: coverage is wanted in streamjoin's code.
import fastavro  # noqa: F401
import numpy  # noqa: F401
import pandas  # noqa: F401
import pyarrow  # noqa: F401
import pyarrow.json  # noqa: F401

# numba compiles its kernels from their bytecode, which instrumented bytecode is not: loaded plain.
import streamjoin.engine.hash_kernels  # noqa: F401
import streamjoin.engine.json_scan  # noqa: F401
import streamjoin.engine.row_kernels  # noqa: F401
import streamjoin.engine.text_kernels  # noqa: F401

with atheris.instrument_imports(include=["streamjoin"]):
    from tests.fuzz.targets import target


def main() -> None:
    decoder = sys.argv.pop(1)
    atheris.Setup(sys.argv, target(decoder))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
