"""The benchmarks' arithmetic and helpers, on hand values (no trl import, no timing claims)."""
import sys

import pytest

from benchmarks import common as C


def test_mfu_on_hand_values():
    # 6 * 1e6 params * 1e4 tokens = 6e10 FLOP in 1 s on a 100 GFLOP/s machine -> 0.6
    assert C.mfu(1_000_000, 10_000, 1.0, 100.0) == pytest.approx(0.6)
    assert C.mfu(1_000_000, 10_000, 2.0, 100.0, factor=2) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        C.mfu(1, 1, 0.0, 1.0)


def test_padding_stats_and_summary():
    stats = C.padding_stats([(30, 40), (10, 60)])
    assert stats == {"real_tokens": 40, "processed_positions": 100, "padding_fraction": pytest.approx(0.6)}
    assert C.summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}


def test_matmul_peak_is_the_best_shape():
    out = C.matmul_peak(sizes=((64, 64, 64), (32, 128, 16)), repeats=1, min_seconds=0.001)
    assert out["peak_gflops"] == max(out["per_shape_gflops"].values()) > 0
    assert set(out["per_shape_gflops"]) == {"64x64x64", "32x128x16"}


def test_workload_lengths_and_tokenizer(tmp_path):
    paths = C.write_workload(str(tmp_path), 40, 8, seed=1)
    from datamodules.tokenizers import load_tokenizer

    tok = load_tokenizer(paths["tokenizer"])
    assert len(tok) == C.VOCAB_SIZE
    rows = C.make_pairs(40, seed=1)
    for row in rows:
        for key in ("chosen", "rejected"):
            n = 5 + len(row["prompt"].split()) + len(row[key][-1]["content"].split()) + 1
            assert C.MIN_TOKENS <= n <= C.MAX_TOKENS
    assert "trl" not in sys.modules


def test_step_timer_window():
    t = C.StepTimer(warmup=1)
    t.marks, t.items = [0.0, 1.0, 3.0, 6.0], [{"pairs": 1}] * 4
    seconds, items = t.window()
    assert seconds == 5.0 and len(items) == 2
    assert t.step_times() == [2.0, 3.0]


def test_data_prep_workload_and_measured_child(tmp_path):
    import pyarrow.parquet as pq

    from benchmarks import bench_data_prep as D

    paths = D.write_parquet_workload(str(tmp_path), 25, 5)
    assert pq.read_table(f"{paths['data_dir']}/train_prefs.parquet").num_rows == 25
    assert pq.read_table(f"{paths['data_dir']}/test_prefs.parquet").num_rows == 5
    assert D.dir_size_mb(paths["data_dir"]) > 0
    kw = D.datamodule_kwargs("synthetic", 1000, "tok", "")
    assert kw["source_options"]["synth_helpful_cooking"] == {"n_train": 1000, "n_validation": 50, "n_test": 20}
    out = D.run_measured([sys.executable, "-c", "x = bytearray(50 * 2**20); print('{\"total_s\": 1.5}')"])
    assert out["total_s"] == 1.5 and out["peak_rss_mb"] >= 50 and out["cpu_s"] >= 0
    assert "trl" not in sys.modules


def test_w2s_anchor_workload_is_the_shipped_student():
    """bench_anchor.py's w2s_ variants build the model of configs/model/minilm_student.yaml with the demo's sizes."""
    import yaml

    from benchmarks import bench_anchor as B

    with open(C.ROOT / "configs" / "model" / "minilm_student.yaml") as f:
        init = yaml.safe_load(f)["model"]["init_args"]
    for key, value in B.W2S_STUDENT.items():
        assert init[key] == value, key
    assert init["objective"]["class_path"].endswith("SoftBradleyTerry")
    assert init["optimizer"]["init_args"] == {"lr": B.W2S_LR, "weight_decay": 0.0}
    with open(C.ROOT / "configs" / "experiment" / "w2s_demo.yaml") as f:
        demo = f.read()
    assert '"synth_helpful_cooking": {"n_train": 1600, "n_validation": 200, "n_test": 300}' in demo
    assert B.W2S_PAIRS == {"n_train": 1600, "n_validation": 200, "n_test": 300}
    assert {"anchor_coef": 100.0, "cache_outputs": True}.items() <= B.VARIANTS["w2s_anchor"].items()
    # the demo sweeps λ (chosen on ID validation); the benchmark measures its middle value
    assert "--model.anchor_coef: [10.0, 100.0, 1000.0, 10000.0]" in demo and "--reference.cache_outputs=true" in demo


def test_fit_clock_summary():
    from benchmarks.bench_anchor import FitClock

    clock = FitClock()
    clock.steps = [(0, 5.0), (0, 1.0), (0, 3.0), (1, 2.0), (1, 4.0), (1, 0.5)]
    clock.epochs, clock.epochs_cpu = [10.0, 7.0], [18.0, 13.0]
    out = clock.summary(warmup=1)  # epoch 1 without its first step
    assert out == {"epoch1_step_s_mean": 2.0, "epoch1_step_s_median": 3.0, "epoch1_s": 10.0, "epoch1_cpu_s": 18.0,
                   "epoch2_step_s_mean": 2.1667, "epoch2_step_s_median": 2.0, "epoch2_s": 7.0, "epoch2_cpu_s": 13.0,
                   "fit_train_s": 17.0, "fit_train_cpu_s": 31.0, "steps_per_epoch": 3}


def test_targets_table_reads_one_invocation(tmp_path):
    """run_all.sh's PASS / FAIL table: bars applied to hand-made JSON files; a missing benchmark is "not run"."""
    import json

    from benchmarks import targets

    def write(name, obj, prefix=""):
        (tmp_path / f"{name}.json").write_text(prefix + json.dumps(obj) + "\n")

    write("rm_train", {"ratios_vs_trl": {"ours": {"pairs_per_s": 2.71, "per_round": [2.7, 2.49, 2.88]}},
                       "results": {"ours": {"useful_mfu": {"median": 0.54, "min": 0.5, "max": 0.6}}}})
    write("rm_eval", {"ratios_vs_trl": {"ours": {"pairs_per_s": 3.0, "per_round": [3.0]}}},
          prefix="{'eval_loss': 0.1}\n")  # TRL's evaluate line before ours
    grpo = {f"ours/trl@beta={b}": {"completions_per_s": r, "per_round": [r], "median_step": r}
            for b, r in (("0", 2.0), ("0.04", 1.99))}
    write("grpo", {"ratios_vs_trl": grpo, "results": {f"{v}@beta={b}": {"spread": 0.05} for v in ("ours", "trl")
                                                       for b in ("0", "0.04")}})
    write("demo", {"target": {"wall_s_median": 200.0}, "tables_equal_docs": False,
                   "results": {"after": {"cpu_s": {"median": 300.0}}}})
    text, all_pass = targets.table(str(tmp_path))
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in text.splitlines()[2:]}
    assert rows["RM training ≥ 2× TRL pairs/s"][2:4] == ["2.71", "PASS"]
    assert rows["RM eval ≥ 3× TRL pairs/s"][2:4] == ["3", "PASS"]  # the bar is inclusive
    assert rows["RM training MFU (model FLOPs)"][2:4] == ["0.54", "FAIL"]
    assert rows["GRPO ≥ 2× TRL completions/s, β = 0"][3] == "PASS"
    assert rows["GRPO ≥ 2× TRL completions/s, β = 0.04"][3] == "FAIL"
    assert rows["`make demo` wall s, fresh cache (table = docs)"][3] == "FAIL"  # fast, but the table moved
    assert rows["data prep: peak RSS at 300k pairs, MB"][3] == "not run"
    assert not all_pass
