#!/usr/bin/env bash
# The wheel as a user installs it: build sdist and wheel (the wheel from the sdist) from a copy of
# the checkout's files, install the wheel, not editable, with its dependencies into a fresh venv,
# and run every subcommand from a folder outside the checkout. torch is not installed there, as with
# a bare `pip install dabench-ir`: `export` must refuse in one line, and the model the other
# commands read is exported with the checkout's venv (PYTHON, default .venv/bin/python).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
step() { printf 'wheel smoke: %s\n' "$*"; }

step "build sdist and wheel"
mkdir "$work/src"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work/src")
env -u PYTHONDONTWRITEBYTECODE "$python" -m build --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1 \
    || { tail -30 "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/dabench_ir-*.whl)

step "install $(basename "$wheel") into a fresh venv"
"$python" -m venv "$work/venv"  # no --system-site-packages: only what the wheel asks for
"$work/venv/bin/pip" install --disable-pip-version-check "$wheel" >"$work/install.log" 2>&1 \
    || { tail -30 "$work/install.log"; exit 1; }
bin=$work/venv/bin/dabench-ir
cd "$work"  # outside the checkout: nothing can be imported from it
"$work/venv/bin/python" - "$work/venv/" <<'PY'
import importlib.util, sys
import dabench_ir
assert dabench_ir.__file__.startswith(sys.argv[1]), f"dabench_ir imported from {dabench_ir.__file__}"
assert importlib.util.find_spec("torch") is None, "torch is in the fresh venv"
PY

run() { step "dabench-ir $*"; "$bin" "$@" >"$work/out.log" 2>&1 || { cat "$work/out.log"; exit 1; }; passed=$((passed + 1)); }
refused() {  # exit 2 and one line on stderr
    step "dabench-ir $* (refused)"
    local rc=0; "$bin" "$@" >/dev/null 2>"$work/err.log" || rc=$?
    [[ $rc == 2 && $(wc -l <"$work/err.log") == 1 ]] || { echo "expected exit 2 and one line, got $rc:"; cat "$work/err.log"; exit 1; }
    passed=$((passed + 1))
}

run --version
run --help
run targets
run targets --show h100
refused export --family gpt2 --layers 1 --hidden 64 --heads 2 --seq 8 -o "$work/no-torch.onnx"
step "model.onnx exported with the checkout's venv"
"$root/.venv/bin/dabench-ir" export --family gpt2 --layers 2 --hidden 64 --heads 2 --seq 16 -o model.onnx >/dev/null
run profile model.onnx --target rdu --json rdu.json --html rdu.html --csv rdu.csv --trace rdu.trace.json
run profile model.onnx --target h100 --json h100.json
run profile model.onnx --target wse,ipu --json cmp/
run profile model.onnx --target cpu --measure
run scale model.onnx --target h100 --chips 1,2 --strategy dp
run compare rdu.json h100.json
run diff rdu.json h100.json
run study model.onnx --pipeline none,ort-basic --target rdu
run sweep --list
run sweep smoke -o sweep --dry-run
run reproduce --list
run calibrate --quick
run validate --target rdu
run demo --model model.onnx --targets rdu,cpu --no-validate -o demo
step "every subcommand ran from the installed wheel (${SECONDS} s)"
echo "wheel_smoke: $passed passed, 0 failed"
