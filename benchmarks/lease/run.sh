#!/usr/bin/env bash
# One GPU lease (docs/results.md, "The GPU lease of the eleventh stop"): the CUDA tests, where each factorisation
# is fastest, growbench targets' scale part (widest first), its --skip-scale part, then the gpu-scale sweep's
# third seed with whatever time is left; each phase capped so that the call ends by BUDGET seconds (560).
#
# Prepared here: copy this folder to .lease/ (ignored through .git/info/exclude) with a pebble wheel beside it,
#   mkdir -p .lease && cp benchmarks/lease/* .lease/ && pip download --no-deps pebble==5.2.3 -d .lease/
# then the device tool's run, carry [".lease"], timeout_s 600: `BUDGET=560 bash .lease/run.sh`. What a lease
# lacks: pebble (the wheel) and the package under its name (the folders linked into /tmp/pkg/growbench).
# What comes back is under $OUT (8 files at most).
HERE=$(cd "$(dirname "$0")" && pwd)
START=$(date +%s); DEADLINE=$((START + ${BUDGET:-560}))
left() { echo $((DEADLINE - $(date +%s))); }
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$HERE"/*.whl || exit 1
mkdir -p /tmp/pkg/growbench
for d in strategies models datasets harness; do ln -sfn "$PWD/$d" /tmp/pkg/growbench/$d; done
export PYTHONPATH=/tmp/pkg:/tmp/site
{
  date -u; nvidia-smi --query-gpu=name,memory.used,utilization.gpu,clocks.sm --format=csv
  python3 -c 'import torch, transformers, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0], "transformers", transformers.__version__)'
  nproc; git log --oneline -1 2>/dev/null
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
echo "== cuda tests $(left) s left"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_datasets.py tests/test_degenerate.py tests/test_regimes.py -k "cuda or device" -rs 2>&1 | tail -15 | tee "$OUT/cuda_tests.txt"
echo "== factorisations $(left) s left"
timeout 75 python3 "$HERE/factorisations.py" cuda 2>&1 | tee "$OUT/factor_bench.txt"
echo "== scale part $(left) s left"
CACHE=/tmp/cache REPEATS=5 THREADS=8 timeout $(( $(left) - 150 )) python3 "$HERE/scale_part.py" cuda "$OUT" 4096,1024,768,256,64 2>&1 | tee "$OUT/scale.log"
echo "== targets --skip-scale $(left) s left"
timeout $(( $(left) - 40 )) "$HERE/gb" targets --device cuda --skip-scale --repeats 5 --threads 8 --cache-dir /tmp/cache 2>&1 | tee "$OUT/targets_skip.log"
echo "== gpu-scale seed 2 $(left) s left"
timeout $(( $(left) - 8 )) "$HERE/gb" run --preset gpu-scale --seeds 2 --db /tmp/gpu.sqlite --cache-dir /tmp/cache --jobs 3 --threads 4 --no-progress 2>&1 | tail -20
# One file back, whatever a killed sweep left in its journal
[ -f /tmp/gpu.sqlite ] && python3 -c "import sqlite3, sys; sqlite3.connect('/tmp/gpu.sqlite').backup(sqlite3.connect(sys.argv[1]))" "$OUT/gpu.sqlite"
date -u; nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv
