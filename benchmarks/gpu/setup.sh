# Sourced on the lent GPU machine (see README.md here): installs the wheels that
# ../shared/tools/gpu-carry sent to /tmp/gw (once per machine), then raysearch itself, and sets
# the environment. The GPU machine's image has PyTorch and CUDA 13 but no Ray, Optuna or
# onnxruntime-gpu.
export PYTHONUNBUFFERED=1
if [ ! -f /tmp/site/.done ]; then
  (cd /tmp/gw && for p in *.part00; do [ -e "$p" ] || continue; w=${p%.part00}; cat $w.part* > $w && rm $w.part*; done)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/gw/*.whl || return 1
  touch /tmp/site/.done
fi
rm -rf /tmp/rs && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/rs . >/dev/null 2>&1 || { echo "raysearch install failed"; return 1; }
export PYTHONPATH=/tmp/rs:/tmp/site PATH=/tmp/rs/bin:/tmp/site/bin:$PATH
export RAY_USAGE_STATS_ENABLED=0
# Scripts run from the checkout (benchmarks/) import raysearch from it: its configs/ folder
# ships as raysearch.configs only when installed, so link it in for them.
ln -sfn ../configs raysearch/configs
# quality.py reads the shared models from ../shared/models: carried as gpu_data/models.
if [ -d gpu_data/models ]; then mkdir -p ../shared && ln -sfn "$PWD/gpu_data/models" ../shared/models; fi
