#!/usr/bin/env bash
# A lent GPU host's first minutes: launch/accelerator_check.sh OUT [--preset=cpu] [driver flags]
#
# Prepared here, then one call of the device tool (carry .gpu_carry, command
# `bash launch/accelerator_check.sh $OUT`):
#   launch/gpu_wheels.sh .gpu_carry/wheels                       # the wheels the host lacks
#   mkdir -p .gpu_carry/data && cp -r ../shared/data/multi30k .gpu_carry/data/
# On the host (Python 3.12 with its own jax, flax, numpy; no network) it
#   1. prints nvidia-smi and the python it uses (stage 'host');
#   2. installs the carried wheels with --no-index --no-deps into a fresh target folder put first
#      on PYTHONPATH, never jax, jaxlib, flax or numpy (stage 'wheels');
#   3. runs launch/accelerator_check.py, whose stages each run under their own time box.
# A failed stage is one line in OUT/summary.md and the next one still runs; the whole command
# exits 1 when any stage failed. OUT gets summary.json, summary.md, check.log (all output) and
# pip.log. Environment: PYTHON (default python3), WHEELS (default .gpu_carry/wheels), SITE (the
# target folder, default a new one), TRANSFORMER_JAX_DATA_DIR (default .gpu_carry/data).
set -u -o pipefail

out=${1:?usage: launch/accelerator_check.sh OUT [--preset=gpu|cpu] [driver flags]}
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
wheels=${WHEELS:-$repo/.gpu_carry/wheels}
preset=gpu
for arg in "$@"; do
  case $arg in --preset=*) preset=${arg#--preset=};; esac
done
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/accelerator_check.XXXXXX")
site=${SITE:-$work/site}
stages=$work/shell_stages.jsonl
piplog=$out/pip.log
: > "$piplog"
export PYTHONUNBUFFERED=1
if [[ -z ${TRANSFORMER_JAX_DATA_DIR:-} && -d $repo/.gpu_carry/data ]]; then
  export TRANSFORMER_JAX_DATA_DIR=$repo/.gpu_carry/data
fi
exec > >(tee -a "$out/check.log") 2>&1

now() { date +%s.%N; }
# record NAME STATUS START BOX MESSAGE: one JSON line of the summary's stages.
record() {
  "$py" -c 'import json, sys, time
name, status, start, box, message = sys.argv[1:]
print(json.dumps({"name": name, "status": status, "seconds": round(time.time() - float(start), 2),
                  "timebox_s": float(box), "message": message}))' "$@" >> "$stages" ||
    echo "{\"name\": \"$1\", \"status\": \"failed\", \"message\": \"$py cannot run\"}" >> "$stages"
  echo "== $1: $2${5:+: $5}"
}

# Stage 'host': what the machine is.
box=10
start=$(now)
echo "accelerator check, preset $preset, $(date -u +%FT%TZ), $(uname -srm)"
echo "python: $(command -v "$py") $("$py" --version 2>&1)"
if command -v nvidia-smi >/dev/null; then
  if timeout "$box" nvidia-smi; then
    record host ok "$start" "$box" ""
  else
    record host failed "$start" "$box" "nvidia-smi failed (status $?)"
  fi
elif [[ $preset == gpu ]]; then
  record host failed "$start" "$box" "no nvidia-smi on PATH: no NVIDIA driver visible"
else
  record host ok "$start" "$box" "no nvidia-smi (the CPU rehearsal)"
fi

# Stage 'wheels': the carried wheels into $site, all at once, else one by one to name the bad.
box=30
start=$(now)
mapfile -t found < <(ls "$wheels"/*.whl 2>/dev/null)
keep=()
for whl in "${found[@]}"; do
  name=$(basename "$whl")
  name=${name%%-*}
  case ${name,,} in
    jax|jaxlib|flax|numpy) echo "not installing $(basename "$whl"): the host's own $name is checked";;
    *) keep+=("$whl");;
  esac
done
pip_install() {
  timeout "$1" "$py" -m pip install --no-index --no-deps --no-compile --no-cache-dir \
    --disable-pip-version-check --upgrade --target "$site" "${@:2}" >> "$piplog" 2>&1
}
if (( ${#keep[@]} == 0 )); then
  record wheels failed "$start" "$box" \
    "no wheelhouse: no wheels in $wheels (launch/gpu_wheels.sh DIR builds it; carry it)"
elif pip_install "$box" "${keep[@]}"; then
  record wheels ok "$start" "$box" ""
  echo "installed ${#keep[@]} wheels into $site"
else
  bad=()
  for whl in "${keep[@]}"; do
    left=$("$py" -c "import time; print(max(1, int($box - (time.time() - $start))))")
    pip_install "$left" "$whl" || bad+=("$(basename "$whl")")
  done
  record wheels failed "$start" "$box" \
    "wheels that do not install: ${bad[*]:-none alone, but not all together} (pip.log)"
fi
export PYTHONPATH=$site:$repo${PYTHONPATH:+:$PYTHONPATH}

# The driver's stages, each under its own time box.
cd "$repo" || exit 2
"$py" launch/accelerator_check.py --out="$out" --shell_stages="$stages" --work="$work" "$@"
status=$?
if [[ ! -s $out/summary.json ]]; then
  echo "error: launch/accelerator_check.py wrote no summary (status $status)"
  status=2
fi
exit "$status"
