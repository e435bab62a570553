# Weight-only quantization of bytegpt on the lent GPU (issue 46 item 6): the WeightOnly search
# with four trials sharing the GPU (its sensitivity probes are trials too), each trial's device
# printed by report.py; then MatMulNBits decode (1 token) and prefill (128 tokens) latency on
# ONNX Runtime's CUDA provider and on the CPU for the float model, ONNX Runtime's int4 default,
# int8 with accuracy_level 4 and the search's best/ (lm_latency.py). bytegpt travels as
# gpu_data/models/bytegpt (README.md here). Output under $OUT.
source benchmarks/gpu/setup.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c 'from raysearch.providers import cuda_available; print("CUDA loads:", cuda_available())'
m=gpu_data/models/bytegpt
cat > /tmp/wo.json <<JSON
{"model": "$PWD/$m/model.onnx", "calibration_data": "$PWD/$m/calib.npz",
 "eval_data": "$PWD/$m/eval.npz", "search_space": "WEIGHT_ONLY_INT4_SEARCH",
 "search_algo": "WeightOnly", "metric": "kl", "tolerance": 0.00025, "select": "size",
 "seed": 0, "resources": {"gpu_per_trial": 0.25, "max_concurrent_trials": 4},
 "stop": {"time_limit": ${WO_TIME_LIMIT:-180}}}
JSON
SECONDS=0
timeout 300 raysearch run /tmp/wo.json --output-dir /tmp/wo > $OUT/wo_gpu.log 2>&1
echo "weight_only search: exit $?, ${SECONDS} s"; tail -15 $OUT/wo_gpu.log
python3 benchmarks/gpu/report.py /tmp/wo > $OUT/wo_gpu.txt
python3 - <<'PY'
import pyarrow.parquet as pq, collections
rows = pq.read_table("/tmp/wo/results.parquet").to_pylist()
print("trials by device:", collections.Counter(str(r.get("device")) for r in rows))
print("trials by stage:", collections.Counter(str(r.get("stage")) for r in rows))
PY
best=$(ls /tmp/wo/best/*.onnx 2>/dev/null | head -1)
python3 benchmarks/gpu/lm_latency.py /tmp/lmlat $OUT/lm_latency.json $m/model.onnx ${best:+best=$best}
