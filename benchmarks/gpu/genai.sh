# bytellama's genai folder on the lent GPU (issue 55, Build item 5): genai_cuda.py (see it).
# The builder's `-p fp16 -e cuda` and `-p int4 -e cuda` folders of bytellama's checkpoint and
# bytegpt's calib.npz/eval.npz travel as gpu_data/bytellama (README.md here). Output under $OUT.
source benchmarks/gpu/setup.sh || exit 1
# onnxruntime-genai-cuda links CUDA 13's libraries by name: the image's nvidia-* packages.
nv=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])')
export LD_LIBRARY_PATH=$(find "$nv" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:):${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c 'import onnxruntime as o, onnxruntime_genai as og; print(o.__version__, o.get_available_providers(), og.__version__, og.is_cuda_available())'
d=$PWD/gpu_data/bytellama
mkdir -p /tmp/gc
(while sleep 5; do nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; done > $OUT/gpu_apps.log 2>&1) &
timeout 560 python3 benchmarks/gpu/genai_cuda.py $d/fp16cuda $d/int4cuda $d/eval.npz $d/calib.npz /tmp/gc $OUT/genai_cuda.json 2>&1 | tee $OUT/genai_cuda.log | tail -60
kill %1 2>/dev/null
cp /tmp/gc/s/auto_search.log $OUT/ 2>/dev/null; python3 benchmarks/gpu/report.py /tmp/gc/s > $OUT/genai_cuda_trials.txt 2>&1
sort -u $OUT/gpu_apps.log | head -20
