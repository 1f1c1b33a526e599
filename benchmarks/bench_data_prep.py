"""Data preparation at real-dataset size: PreferenceDataModule tokenizing and caching 10^5 pairs.

    .venv/bin/python benchmarks/bench_data_prep.py --sizes 100000 300000 --num-proc 2
    .venv/bin/python benchmarks/bench_data_prep.py --workload ultrafeedback --sizes 100000 300000 --num-proc 2

Workloads, each through the real path (source adapter, seeded halves, `PairTokenizer` under `datasets.map`, the
atomic cache under `cache_dir` -- $SHIFTGEN_CACHE in a run -- and `setup`'s column arrays):
- synthetic (default): the synthetic benchmark's source domain `synth_helpful_cooking` generated at N train pairs
  (validation N/20, test N/50) by `synthetic_shift.generate_domain`, its word-level tokenizer; ≈ 30-40 tokens
  per sequence.
- ultrafeedback: `common.make_pairs` (the benchmarks' preference workload: 23-243 tokens per sequence, mean ≈ 97)
  written once as local files in the UltraFeedback hub schema (`train_prefs.parquet` / `test_prefs.parquet`, N
  and N/50 pairs; 5% of train carved as validation), read by the `ultrafeedback` adapter.

Per size, each in a fresh process on a fresh cache:
- cold: `prepare_data()` then `setup("fit")`, as a first training run does (tokenize, write, reload);
- reload: a second process doing the same on the now-warm cache, as a second run does;
and the cache's size on disk. Peak RSS is each process's own maximum resident set (`os.wait4`'s rusage of that
child), and the largest of its `datasets.map` workers when `--num-proc` > 1. Workload files are generated once per
size (not timed). Prints one JSON line; a markdown table to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as C  # noqa: E402

CHUNK = 10_000  # pairs per generated chunk (chunk c uses seed 1000 * base seed + c): rows never all in memory


def write_parquet_workload(work_dir: str, n_train: int, n_test: int, seed: int = 0) -> dict:
    """Tokenizer + `train_prefs.parquet` / `test_prefs.parquet` of make_pairs rows, written chunk by chunk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(work_dir, exist_ok=True)
    tok_dir = os.path.join(work_dir, "tokenizer")
    if not os.path.isfile(os.path.join(tok_dir, "tokenizer.json")):
        C.build_tokenizer(tok_dir)
    data_dir = os.path.join(work_dir, f"parquet-{n_train}-{n_test}-{seed}")
    done = os.path.join(data_dir, "COMPLETE")
    if not os.path.isfile(done):
        os.makedirs(data_dir, exist_ok=True)
        for split, n, base in (("train_prefs", n_train, seed), ("test_prefs", n_test, seed + 10_000)):
            writer = None
            for c, start in enumerate(range(0, n, CHUNK)):
                table = pa.Table.from_pylist(C.make_pairs(min(CHUNK, n - start), 1000 * base + c))
                writer = writer or pq.ParquetWriter(os.path.join(data_dir, f"{split}.parquet"), table.schema)
                writer.write_table(table)
            writer.close()
        open(done, "w").close()
    return {"tokenizer": tok_dir, "data_dir": data_dir}


def dir_size_mb(path: str) -> float:
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total / 2**20


def num_proc_option(num_proc: int) -> dict:
    """`num_proc` for the datamodule when it takes one (so the script also measures the code before it did)."""
    import inspect

    from datamodules.preference.datamodule import PreferenceDataModule

    return {"num_proc": num_proc} if "num_proc" in inspect.signature(PreferenceDataModule).parameters else {}


def synthetic_tokenizer(work_dir: str) -> str:
    """The word-level tokenizer over the synthetic benchmark's vocabulary (as the tests and the demo build it)."""
    from datamodules.preference.synthetic_shift import synthetic_vocabulary
    from datamodules.tokenizers import build_wordlevel_tokenizer

    out = os.path.join(work_dir, "synthetic_tokenizer")
    if not os.path.isfile(os.path.join(out, "tokenizer.json")):
        build_wordlevel_tokenizer(synthetic_vocabulary()).save_pretrained(out)
    return out


def datamodule_kwargs(workload: str, pairs: int, tokenizer: str, data_dir: str) -> dict:
    if workload == "synthetic":
        name = "synth_helpful_cooking"
        sizes = dict(n_train=pairs, n_validation=max(1, pairs // 20), n_test=max(1, pairs // 50))
        return dict(source=name, tokenizer=tokenizer, source_options={name: sizes}, max_length=128)
    return dict(source="ultrafeedback", tokenizer=tokenizer, local_dirs={"ultrafeedback": data_dir},
                max_length=C.MAX_TOKENS + 8)


def worker(args) -> dict:
    """One preparation (cold or warm, depending on the cache) in this process."""
    from datamodules.preference.datamodule import PreferenceDataModule

    t0 = time.perf_counter()
    dm = PreferenceDataModule(
        **datamodule_kwargs(args.workload, args.pairs, args.tokenizer, args.data_dir), train_subset="all",
        train_labels="gold", batch_size=16, eval_batch_size=64, seed=0, cache_dir=args.cache_dir,
        **num_proc_option(args.num_proc))
    dm.prepare_data()
    t1 = time.perf_counter()
    dm.setup("fit")
    t2 = time.perf_counter()
    train = dm._train_set()
    first = next(iter(dm.train_dataloader()))  # the columns serve batches
    return {"prepare_data_s": round(t1 - t0, 3), "setup_s": round(t2 - t1, 3), "total_s": round(t2 - t0, 3),
            "train_pairs": len(train), "sizes": dm.manifest["sizes"],
            "cached": {k: v.get("cached") for k, v in dm.manifest["tokenization"].items()},
            "first_batch_shape": list(first["input_ids"].shape),
            "self_peak_rss_mb": round(C.peak_rss_mb(), 1),
            "map_workers_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0, 1)}


def run_measured(cmd: list[str]) -> dict:
    """Run a worker; its JSON result plus its own peak RSS and its children's (map workers), from os.wait4."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, cwd=str(C.ROOT))
        _, status, usage = os.wait4(proc.pid, 0)  # reaps the child with its own rusage
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        out, err = out.read(), err.read()
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed ({proc.returncode}):\n{err[-4000:]}")
    res = json.loads([ln for ln in out.strip().splitlines() if ln.startswith("{")][-1])
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    res["peak_rss_mb"] = round(usage.ru_maxrss / 1024.0, 1)  # Linux: KiB; this child alone
    res["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 2)  # the child's and its map workers' CPU time
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=["synthetic", "ultrafeedback"], default="synthetic")
    p.add_argument("--sizes", nargs="+", type=int, default=[100_000, 300_000], help="train pairs per run")
    p.add_argument("--test-fraction", type=float, default=0.02, help="test pairs as a share of train pairs")
    p.add_argument("--num-proc", type=int, default=2, help="--data.num_proc (datasets.map processes)")
    p.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "shiftgen_bench_data"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", help=argparse.SUPPRESS)
    p.add_argument("--data-dir", help=argparse.SUPPRESS)
    p.add_argument("--pairs", type=int, help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    C.offline_env()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    rows = []
    t_all = time.perf_counter()
    for n in sorted(args.sizes):
        t0 = time.perf_counter()
        if args.workload == "ultrafeedback":
            paths = write_parquet_workload(args.work_dir, n, max(1, int(n * args.test_fraction)))
        else:  # generated inside the measured preparation, as a run does
            paths = {"tokenizer": synthetic_tokenizer(args.work_dir), "data_dir": ""}
        gen_s = time.perf_counter() - t0
        cache = os.path.join(args.work_dir, f"cache-{args.workload}-{n}")
        shutil.rmtree(cache, ignore_errors=True)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--workload", args.workload, "--pairs", str(n),
               "--tokenizer", paths["tokenizer"], "--data-dir", paths["data_dir"], "--cache-dir", cache,
               "--num-proc", str(args.num_proc)]
        cold = run_measured(cmd)
        size_mb = dir_size_mb(cache)
        warm = run_measured(cmd)
        if any(not v for v in warm["cached"].values()):
            raise RuntimeError(f"the second run re-tokenized: {warm['cached']}")
        row = {"pairs": n, "test_pairs": max(1, int(n * args.test_fraction)), "train_pairs": cold["train_pairs"],
               "cold_s": cold["total_s"], "cold_prepare_data_s": cold["prepare_data_s"],
               "cold_setup_s": cold["setup_s"], "reload_s": warm["total_s"],
               "reload_fraction": round(warm["total_s"] / cold["total_s"], 4),
               "cold_cpu_s": cold["cpu_s"], "reload_cpu_s": warm["cpu_s"],
               "cold_peak_rss_mb": cold["peak_rss_mb"],
               "cold_map_workers_peak_rss_mb": cold["map_workers_peak_rss_mb"], "reload_peak_rss_mb": warm["peak_rss_mb"],
               "cache_mb": round(size_mb, 1), "input_files_mb": round(dir_size_mb(paths["data_dir"]), 1) if paths["data_dir"] else 0.0,
               "us_per_pair_cold": round(1e6 * cold["total_s"] / n, 1),
               "cpu_us_per_pair_cold": round(1e6 * cold["cpu_s"] / n, 1), "write_input_files_s": round(gen_s, 1),
               "loadavg": C.machine_info()["loadavg"]}
        rows.append(row)
        C.eprint(json.dumps(row))
        shutil.rmtree(cache, ignore_errors=True)
    lo, hi = rows[0], rows[-1]
    targets = {
        # linear: per-pair time of the largest size within 10% of the smallest's
        # (wall time; CPU time -- the process and its map workers, less sensitive to other jobs -- beside it)
        "linear_scaling": {"per_pair_ratio": round(hi["us_per_pair_cold"] / lo["us_per_pair_cold"], 3),
                           "cpu_per_pair_ratio": round(hi["cpu_us_per_pair_cold"] / lo["cpu_us_per_pair_cold"], 3),
                           "pass": hi["us_per_pair_cold"] <= 1.10 * lo["us_per_pair_cold"]},
        "reload_le_5pct": {"worst": max(r["reload_fraction"] for r in rows),
                           "pass": all(r["reload_fraction"] <= 0.05 for r in rows)},
        "peak_rss_lt_2gb": {"worst_mb": max(r["cold_peak_rss_mb"] for r in rows),
                            "pass": all(r["cold_peak_rss_mb"] < 2048 for r in rows)},
    }
    out = {"bench": "data_prep", "workload": args.workload, "machine": C.machine_info(), "num_proc": args.num_proc,
           "rows": rows,
           "targets": targets, "wall_s": round(time.perf_counter() - t_all, 1)}
    keys = ["pairs", "cold_s", "cold_cpu_s", "reload_s", "reload_fraction", "cold_peak_rss_mb", "reload_peak_rss_mb",
            "cache_mb", "us_per_pair_cold", "cpu_us_per_pair_cold"]
    C.eprint(C.markdown_table(keys, [[r[k] for k in keys] for r in rows]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
