#!/usr/bin/env bash
# Developer entry point. On a fresh machine:
#   ./dev.sh demo   build the example wheel with the hook, install it in a fresh
#                   environment, and time the compiled encoder against eager
#   ./dev.sh test   run the test suite (what CI runs)
#   ./dev.sh bench  the cold-start benchmark (benchmarks/cold_start.py)
# TORCH_REQUIREMENT picks the torch for the dev environment (default torch==2.13.0).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
TORCH_REQUIREMENT=${TORCH_REQUIREMENT:-torch==2.13.0}

setup() {
  if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
  fi
  .venv/bin/python -m pip install --disable-pip-version-check -q "$TORCH_REQUIREMENT"
  .venv/bin/python -m pip install --disable-pip-version-check -q -e '.[test]'
}

build_example_wheel() {  # build_example_wheel <project folder>: its wheel into .demo/dist
  # python -m build with isolation, as a user would; hatch-precompile comes from
  # .demo/wheelhouse. The full log is kept in .demo/<folder>-build.log.
  local log=".demo/$1-build.log"
  if ! PIP_FIND_LINKS="$PWD/.demo/wheelhouse ${PIP_FIND_LINKS:-}" \
      .venv/bin/python -m build --wheel --outdir .demo/dist "$1" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "building $1 failed; full log: $log" >&2
    exit 1
  fi
  grep -E "precompile:|Successfully" "$log" || true
}

install_example() {
  setup
  rm -rf .demo && mkdir -p .demo
  echo "== building hatch-precompile's wheel"
  .venv/bin/python -m build -q --wheel --no-isolation --outdir .demo/wheelhouse . >/dev/null 2>&1
  echo "== building the example wheel (python -m build, isolated; the hook compiles the encoder)"
  build_example_wheel example_project
  echo "== installing it into a fresh environment"
  .venv/bin/python -m venv .demo/venv
  .demo/venv/bin/python -m pip install --disable-pip-version-check -q .demo/dist/example_pkg-*.whl
}

install_transformers_example() {  # after install_example: adds example_bert (and transformers) to .demo/venv
  echo "== building the transformers example wheel (isolated; transformers enters the build environment, the hook compiles its models)"
  build_example_wheel example_transformers
  echo "== installing it (transformers comes with it) into the same environment"
  .demo/venv/bin/python -m pip install --disable-pip-version-check -q .demo/dist/example_bert-*.whl
}

demo() {
  install_example
  echo "== first output in fresh processes"
  .demo/venv/bin/python scripts/first_output.py
}

bench() {
  install_example
  install_transformers_example
  echo "== benchmark (several minutes: torch.compile runs cold once per run and model)"
  .demo/venv/bin/python benchmarks/cold_start.py "$@"
}

test_suite() {
  setup
  .venv/bin/python -m pytest "$@"
}

case "${1:-}" in
  demo) demo ;;
  test) shift; test_suite "$@" ;;
  bench) shift; bench "$@" ;;
  *) echo "usage: ./dev.sh demo | ./dev.sh test [pytest args] | ./dev.sh bench [benchmark args]" >&2; exit 2 ;;
esac
