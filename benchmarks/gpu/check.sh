# The CUDA path end to end on one GPU: providers, three searches of the embedded magika demo
# with four trials sharing the GPU (plain int8 grid, AdaRound/AdaQuant fine-tuning, NNCF),
# each search's per-trial devices and timings printed by report.py. Output under $OUT.
source benchmarks/gpu/setup.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c 'import onnxruntime as o, ray, optuna, torch; print(o.__version__, o.get_available_providers(), ray.__version__, optuna.__version__, torch.__version__, torch.cuda.is_available())'
python3 -c 'from raysearch.providers import cuda_available, execution_providers; print("CUDA loads:", cuda_available(), execution_providers(0, 1 << 30))'
run() {  # name, then raysearch run arguments
  name=$1; shift
  timeout 280 raysearch run configs/quickstart.yaml resources.gpu_per_trial=0.25 "$@" --output-dir /tmp/$name > $OUT/$name.log 2>&1
  echo "$name: exit $?"; tail -12 $OUT/$name.log
  python3 benchmarks/gpu/report.py /tmp/$name > $OUT/$name.txt; tail -1 $OUT/$name.txt | cut -c1-600
}
run quickstart_gpu
run finetune_gpu search_space=FINETUNE_SEARCH search_algo=Grid stop.iteration_limit=8 stop.time_limit=240
run nncf_gpu 'search_space={quantizer: [nncf], model_type: [transformer, none], preset: [mixed, performance]}' search_algo=Grid
