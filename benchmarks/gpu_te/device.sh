#!/bin/bash
# The device machine's side of the TE kit (issue 58), for the call that carries the last part (and every later call
# while the machine stays warm): check and join the parts (kit.py: a missing or corrupt one is one line, exit 2),
# install the wheels into .gpu_te/site, build transformer_engine_torch there once (timed; the built wheel is kept in
# .gpu_te/build, which the machine keeps while warm), import TE, then run the arguments, if any, with TE importable:
#   bash benchmarks/gpu_te/device.sh python3 benchmarks/gpu_te/battery.py --preset gpu
# Writes $OUT/te_build.log (the build's output and its seconds) and $OUT/te_import.txt.
set -u
kit=${GPU_TE_KIT:-$PWD/.gpu_te}
out=${OUT:-/tmp/gpu_te_out}
mkdir -p "$out"
python3 benchmarks/gpu_te/kit.py join --kit "$kit" || exit 2
site=$kit/site
pipi="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site"
if [ ! -e "$site/.wheels_installed" ]; then
  $pipi "$kit"/small/*.whl "$kit"/whole/*.whl .whl/*.whl || { echo "error: the wheels did not install"; exit 1; }
  touch "$site/.wheels_installed"
fi
built=$(ls "$kit"/build/transformer_engine_torch-*.whl 2>/dev/null | head -1)
if [ -z "$built" ]; then
  rm -rf "$kit/src" && mkdir -p "$kit/src" "$kit/build" \
    && tar xzf "$kit"/small/transformer_engine_torch-*.tar.gz -C "$kit/src"
  t0=$(date +%s)
  # FORCE_BUILD: no attempt to fetch a prebuilt wheel (no network); NO_LOCAL_VERSION: TE refuses a version mismatch
  (cd "$kit"/src/transformer_engine_torch-* && PYTHONPATH=$site NVTE_FRAMEWORK=pytorch NVTE_CUDA_ARCHS=90 \
    MAX_JOBS=16 NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_NO_LOCAL_VERSION=1 python3 -m pip wheel -v --no-build-isolation \
    --no-deps --no-index -w "$kit/build" .) >"$out/te_build.log" 2>&1
  code=$?
  echo "transformer_engine_torch build: exit $code in $(($(date +%s) - t0)) s (MAX_JOBS=16, NVTE_CUDA_ARCHS=90)" \
    | tee -a "$out/te_build.log"
  built=$(ls "$kit"/build/transformer_engine_torch-*.whl 2>/dev/null | head -1)
  [ -n "$built" ] || { tail -40 "$out/te_build.log"; exit 1; }
fi
ls "$site"/transformer_engine_torch*.so >/dev/null 2>&1 || $pipi "$built" \
  || { echo "error: $built did not install"; exit 1; }
export PYTHONPATH=$site:$PWD PYTHONUNBUFFERED=1
python3 -c "import transformer_engine, transformer_engine.pytorch, transformer_engine_torch, megatron.core as m
print('transformer_engine', transformer_engine.__version__, 'imports; megatron-core', m.__version__)" \
  2>&1 | tee "$out/te_import.txt"
[ "${PIPESTATUS[0]}" = 0 ] || exit 1
[ $# -gt 0 ] && exec "$@"
exit 0
