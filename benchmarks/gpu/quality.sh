# usage: bash benchmarks/gpu/quality.sh MODELS TAG: quality.py's three searches and NNCF's
# anchors on the GPU, 8 trials at a time sharing it; writes $OUT/quality_gpu_TAG.json.
source benchmarks/gpu/setup.sh || exit 1
timeout ${QUALITY_TIMEOUT:-540} python3 benchmarks/quality.py --models "$1" \
  --spaces A8W8_SEARCH,NNCF,AUTO_INT8_SEARCH --anchors --concurrent 8 --gpu-per-trial 0.125 \
  --out $OUT/quality_gpu_$2.json 2>&1 | grep -v "WARNING\|INFO\|logging.cc\|^ *@\|^PC:" | tail -60
uptime
