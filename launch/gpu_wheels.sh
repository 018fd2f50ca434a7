#!/usr/bin/env bash
# Builds the GPU host's wheelhouse: launch/gpu_wheels.sh DIR
#
# One wheel per line of launch/gpu_requirements.lock (LOCK=FILE for another), for CPython 3.12 on
# manylinux x86-64: `pip download --no-deps --only-binary=:all:`, and `pip wheel` for a package
# published as an sdist only (promise), which must build a pure-Python wheel here. Prints the
# wheelhouse's size and fails when it is over the device tool's carry (64 MiB with the rest of
# the working tree). The folder is git-ignored; launch/accelerator_check.sh installs from it.
set -euo pipefail

dir=${1:?usage: launch/gpu_wheels.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
lock=${LOCK:-$here/gpu_requirements.lock}
python=${PYTHON:-python3}
limit_mib=${LIMIT_MIB:-60}   # leaves room under 64 MiB for the tree and the data that travel

mkdir -p "$dir"
platforms=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1 \
         manylinux_2_31 manylinux_2_34 manylinux_2_35 manylinux_2_24; do
  platforms+=(--platform "${p}_x86_64")
done

while read -r line; do
  req=${line%%#*}
  req=${req//[[:space:]]/}
  [[ -z $req ]] && continue
  name=${req%%==*}
  case ${name,,} in
    jax|jaxlib|flax|numpy) echo "error: $lock lists $name, which the host provides" >&2; exit 2;;
  esac
  [[ $req == *==* ]] || { echo "error: $lock: '$req' is not NAME==VERSION" >&2; exit 2; }
  if ! "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp "${platforms[@]}" -d "$dir" "$req" 2>/dev/null; then
    echo "$req: no wheel for cp312 manylinux x86-64; building one from its sdist"
    tmp=$(mktemp -d)
    "$python" -m pip wheel -q --no-deps --no-binary=:all: -w "$tmp" "$req"
    for whl in "$tmp"/*.whl; do
      case $whl in
        *-py3-none-any.whl|*-py2.py3-none-any.whl) mv "$whl" "$dir"/;;
        *) echo "error: $req built $(basename "$whl"), not a pure-Python wheel" >&2; exit 1;;
      esac
    done
    rm -rf "$tmp"
  fi
done < "$lock"

count=$(ls "$dir"/*.whl | wc -l)
bytes=$(du -cb "$dir"/*.whl | tail -1 | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "wheelhouse $dir: $count wheels, $bytes bytes ($mib MiB)"
if (( mib > limit_mib )); then
  echo "error: the wheelhouse is $mib MiB, over $limit_mib MiB (the carry limit is 64 MiB)" >&2
  exit 1
fi
