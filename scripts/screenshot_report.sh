#!/usr/bin/env bash
# Render a difforge report.html in headless Chromium and save a PNG screenshot of it.
#   scripts/screenshot_report.sh REPORT.html OUT.png [WIDTH] [HEIGHT]
# The report is self-contained (images base64-embedded), so no network or server is needed.
set -euo pipefail
report=${1:?usage: screenshot_report.sh REPORT.html OUT.png [WIDTH] [HEIGHT]}
out=${2:?usage: screenshot_report.sh REPORT.html OUT.png [WIDTH] [HEIGHT]}
width=${3:-1280}
height=${4:-7000}
browser=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}
if [ -z "$browser" ]; then
  echo "screenshot_report.sh: no chromium found (set CHROMIUM=/path/to/chromium)" >&2
  exit 2
fi
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$profile" \
  --window-size="${width},${height}" --screenshot="$out" "file://$(realpath "$report")" >/dev/null 2>&1
test -s "$out"
echo "$out"
