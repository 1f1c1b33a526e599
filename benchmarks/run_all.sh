#!/usr/bin/env bash
# Every benchmark of docs/benchmarks.md, in sequence (they must not overlap: 2 cores), one JSON line each;
# then the targets table (PASS / FAIL) from this invocation's JSON files, also written to OUT_DIR/targets.md.
#   bash benchmarks/run_all.sh [OUT_DIR]      (needs the bench extra: pip install -e '.[bench]')
#   SMOLLM2=1 ...      also SmolLM2-135M-Instruct, ours vs TRL side by side (issue 37), after the others
#   SMOLLM2=only ...   the matmul peak and those three runs alone (no targets table: it reads the random model's)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/benchmarks}
PY=${PY:-.venv/bin/python}
case "${SMOLLM2:-}" in ""|1|only) ;; *) echo "SMOLLM2 must be unset, 1 or only (got '$SMOLLM2')" >&2; exit 2 ;; esac
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
run() { local name=$1; shift; echo "== $name: $* ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))" >&2
        "$PY" "$@" > "$OUT/$name.json" 2> "$OUT/$name.log"; tail -n 30 "$OUT/$name.log" | grep '^|' >&2 || true; }
run matmul_peak benchmarks/matmul_peak.py
PEAK=$("$PY" -c "import json,sys; print(json.load(open('$OUT/matmul_peak.json'))['peak_gflops'])")
smollm2() {  # both sides load the same SmolLM2 directory, fp32, full fine-tuning (docs/benchmarks.md, issue 37)
  run rm_train_smollm2 benchmarks/bench_rm_train.py --base smollm2 --variants ours trl --repeats 2 \
      --train-pairs 160 --test-pairs 64 --peak-gflops "$PEAK"
  run rm_eval_smollm2 benchmarks/bench_rm_eval.py --base smollm2 --variants ours trl --repeats 2 --test-pairs 128 \
      --peak-gflops "$PEAK"
  run grpo_smollm2 benchmarks/bench_grpo.py --base smollm2 --variants ours trl --repeats 2 --steps 8 --warmup 2
}
if [ "${SMOLLM2:-}" = only ]; then smollm2; exit 0; fi
run rm_step benchmarks/bench_rm_step.py --peak-gflops "$PEAK" --buckets 1 4 8
run rm_train benchmarks/bench_rm_train.py --repeats 3 --train-pairs 400 --peak-gflops "$PEAK"
run rm_eval benchmarks/bench_rm_eval.py --repeats 3 --test-pairs 384 --peak-gflops "$PEAK" \
    --variants ours full_last_layer sorted trl
run anchor benchmarks/bench_anchor.py --repeats 2 --steps 8 --train-pairs 400
run grpo benchmarks/bench_grpo.py --repeats 2 --variants ours ours_ref_in_sampling ours_static ours_generate trl
run rm_train_levers benchmarks/bench_rm_train.py --repeats 1 --train-pairs 400 --peak-gflops "$PEAK" \
    --variants padded grouped full_last_layer random_buckets bf16
run scaling benchmarks/bench_scaling.py --steps 2 --peak-gflops "$PEAK"
run profile_rm benchmarks/profile_steps.py rm --steps 4
run profile_grpo benchmarks/profile_steps.py grpo --steps 6 --beta 0.04
run data_prep benchmarks/bench_data_prep.py --sizes 100000 300000 --num-proc 2
run profile_decode benchmarks/profile_steps.py decode
run anchor_w2s benchmarks/bench_anchor.py --variants w2s_naive w2s_anchor --epochs 2 --repeats 2
run anchor_copy_2epochs benchmarks/bench_anchor.py --variants naive anchor_copy_cached --epochs 2 --repeats 2 \
    --train-pairs 400
run grpo_levers benchmarks/profile_steps.py levers --threads 1 --steps 7
# make demo on a fresh cache (DEMO_BEFORE=<commit> also runs that commit's code, back to back)
run demo benchmarks/bench_demo.py ${DEMO_BEFORE:+--before "$DEMO_BEFORE"}
if [ "${SMOLLM2:-}" = 1 ]; then smollm2; fi
echo >&2; "$PY" benchmarks/targets.py "$OUT" | tee "$OUT/targets.md"
