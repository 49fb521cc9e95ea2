#!/usr/bin/env bash
# Screenshots of the built documentation site (the home page and the hash mode page) for
# docs/development/index.md: builds the site, serves it on localhost and takes each page with
# headless Chromium (Debian: apt-get install chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/development/img
site=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict --quiet --site-dir "$site"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server "$port" --bind 127.0.0.1 --directory "$site" >/dev/null 2>&1 &
server=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/" >/dev/null && break; sleep 0.1; done
mkdir -p "$out"
shoot() {  # page, file, height
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$(mktemp -d)" --hide-scrollbars --window-size=1280,"$3" \
    --screenshot="$out/$2" "http://127.0.0.1:$port/$1" 2>/dev/null
}
shoot index.html site-home.png 1000
shoot modes/hash.html site-hash-mode.png 1000
echo "wrote $out/site-home.png $out/site-hash-mode.png"
