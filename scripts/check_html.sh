#!/usr/bin/env bash
# Manual check of an HTML report in a real (headless) browser.
#
#   scripts/check_html.sh [REPORT.html] [OUT.png]
#
# With no REPORT.html, writes one first: runs `dabench-ir demo --targets rdu` into a temp
# folder and checks its rdu.html. Takes a 1280x2000 screenshot (look at it: the summary cards,
# the roofline and layer plots and the tables should all be there), dumps the rendered DOM
# and greps it for the expected headings, and fails on any console error.
# Needs chromium: `apt-get install -y chromium` (Debian/Ubuntu package name: chromium).
# The automated version of this check is tests/test_html_browser.py.
set -euo pipefail

CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [[ -z "$CHROMIUM" ]]; then
    echo "check_html: chromium not found; install it with: apt-get install -y chromium" >&2
    exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
page=${1:-}
if [[ -z "$page" ]]; then
    dabench-ir demo -o "$work/report" --quiet --targets rdu >/dev/null
    page="$work/report/rdu.html"
fi
shot=${2:-report-screenshot.png}
url="file://$(realpath "$page")"
flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run
       --disable-background-networking --disable-component-update --disable-sync
       --disable-dev-shm-usage --user-data-dir="$work/profile")

"$CHROMIUM" "${flags[@]}" --screenshot="$shot" --window-size=1280,2000 \
    --enable-logging=stderr --v=0 "$url" 2>"$work/log.txt" >/dev/null || true
if grep -E "Uncaught|:CONSOLE|CONSOLE\(" "$work/log.txt"; then
    echo "check_html: console errors (above)" >&2
    exit 1
fi
[[ -s "$shot" ]] || { echo "check_html: no screenshot written" >&2; exit 1; }

"$CHROMIUM" "${flags[@]}" --dump-dom "$url" 2>/dev/null >"$work/dom.html"
for heading in Summary Plots Attribution "Unattributed nodes"; do
    grep -q "$heading" "$work/dom.html" || { echo "check_html: heading '$heading' missing" >&2; exit 1; }
done
echo "check_html: OK; screenshot in $shot ($(stat -c %s "$shot") bytes) - open it and look"
