# AutoRound's weights as a per-node choice on bytellama's genai folder, searched on the lent
# machine's CPUs (genai_source.py). gpu_data/bytellama_cpu holds the builder's fp32 and int4
# -e cpu folders (genai/, int4/), AutoRound's through the builder (autoround/) and bytegpt's
# calib.npz/eval.npz (data/). Output under $OUT.
source benchmarks/gpu/setup.sh || exit 1
# benchmarks/weight_only.py runs raysearch beside its python, and onnxruntime-genai in a python
# of its own (GENAI_PY): here both are the image's python3 with the carried packages.
ln -sf /tmp/rs/bin/raysearch "$(dirname "$(command -v python3)")/raysearch"
printf '#!/bin/sh\nPYTHONPATH=/tmp/site exec python3 "$@"\n' > /tmp/genai_py && chmod +x /tmp/genai_py
export GENAI_PY=/tmp/genai_py
d=$PWD/gpu_data/bytellama_cpu
mkdir -p /tmp/gs
timeout 380 python3 benchmarks/gpu/genai_source.py $d/genai $d/int4 $d/autoround $d/data /tmp/gs $OUT/genai_source.json 2>&1 | tail -20
cp /tmp/gs/search/auto_search.log $OUT/genai_source_search.log 2>/dev/null
python3 benchmarks/gpu/report.py /tmp/gs/search > $OUT/genai_source_trials.txt 2>&1
