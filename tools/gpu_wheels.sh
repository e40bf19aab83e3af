#!/usr/bin/env bash
# Fill .whl/ (git ignores it) with the wheels that a CUDA machine with its own torch and transformers but no
# package registry lacks, at the versions requirements.lock pins, for CPython 3.12 on x86-64 Linux:
#
#   bash tools/gpu_wheels.sh            # here, where pip reaches PyPI
#   # there, from the checkout:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   export PYTHONPATH=$PWD:/tmp/site HF_HUB_OFFLINE=1
#   python3 tools/gpu_check.py --out gpu-check --budget-s 540
#
# The list: wdspack's own dependencies that such an image does not hold (webdataset, simplejpeg), the real
# mistral_common (transformers reads tekken.json through it; the tests' Pixtral tokenizer) with its pydantic
# and jsonschema stack, and num2words (SmolVLM's processor) with docopt. PYTHON_VERSION=3.11 for another one.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.whl/' >> .git/info/exclude; }
names=(webdataset braceexpand simplejpeg mistral-common pydantic pydantic-core annotated-types typing-inspection
       pydantic-extra-types pycountry jsonschema referencing rpds-py jsonschema-specifications num2words docopt)
pins=()
for name in "${names[@]}"; do
  pin=$(grep -ioE "^${name}==[^ ]+" requirements.lock) || { echo "requirements.lock pins no $name" >&2; exit 1; }
  pins+=("$pin")
done
mkdir -p .whl
py=${PYTHON_VERSION:-3.12}
plat=(--python-version "$py" --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64)
binary=() sdist=()
for pin in "${pins[@]}"; do
  case "$pin" in docopt==*) sdist+=("$pin") ;; *) binary+=("$pin") ;; esac
done
python3 -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d .whl "${binary[@]}"
python3 -m pip wheel -q --no-deps -w .whl "${sdist[@]}"   # docopt ships no wheel; it is pure Python
echo "$(ls .whl/*.whl | wc -l) wheels in .whl ($(du -sh .whl | cut -f1))"
