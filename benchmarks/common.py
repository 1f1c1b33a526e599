"""Shared pieces of the benchmarks: offline setup, the workload (tokenizer, model config, preference pairs), the
base model (`--base`: the random workload model or a pretrained directory such as SmolLM2), the machine's fp32
matmul peak, MFU arithmetic, run statistics and the worker-subprocess protocol.

Nothing here imports trl: the TRL side lives only inside the bench_*.py scripts' worker functions.
Every benchmark runs each variant in its own subprocess (so that peak RSS is per variant) and interleaves them
(ours, TRL, ours, TRL, ...); the parent prints one JSON line.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from anywhere without installing

THREADS = int(os.environ.get("BENCH_THREADS", 2))  # 2 = every figure of docs/benchmarks.md; 1 for smoke runs
# Qwen2-style reward-model backbone of the issue: hidden 256, 4 layers (GQA 4 heads / 2 KV heads, SwiGLU 8/3·h).
MODEL_OVERRIDES = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=704, max_position_embeddings=512)
VOCAB_SIZE = 2048
MIN_TOKENS, MAX_TOKENS = 23, 243  # length range of one sequence (prompt + response), BOS/EOS included
FORMAT_WORDS = ("user", "assistant", ":")
N_CONTENT_WORDS = VOCAB_SIZE - 4 - len(FORMAT_WORDS)  # the word-level vocabulary less its 4 specials
RANDOM_BASE = "random"  # `--base` default: the random-init workload model over the word-level tokenizer
# A pretrained base renders prompts with its chat template (SmolLM2's adds a default system prompt: 30 tokens of
# template vs 5 here), so its sequences are longer; this leaves room for any template without truncating.
PRETRAINED_MAX_LENGTH = 2 * (MAX_TOKENS + 8)
WORKER_TIMEOUT, PRETRAINED_WORKER_TIMEOUT = 900.0, 3600.0  # s per worker: SmolLM2 has 36x the random model's matmul params


def offline_env() -> None:
    """Offline, and the thread count fixed before torch does any work."""
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[key] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
    os.environ["WANDB_DISABLED"] = "true"
    os.environ["DISABLE_MLFLOW_INTEGRATION"] = "TRUE"
    import torch

    torch.set_num_threads(THREADS)


# ---- the machine ------------------------------------------------------------------------------------------
def matmul_peak(sizes: Sequence[tuple[int, int, int]] = ((2048, 2048, 2048), (1024, 1024, 1024),
                                                          (4096, 256, 1024), (4096, 1024, 256)),
                repeats: int = 5, min_seconds: float = 0.3) -> dict:
    """fp32 GEMM throughput (GFLOP/s) at `THREADS` threads: the best over shapes of the median over repeats.

    Large square GEMMs give the machine's peak; the skinny ones are the reward model's own shapes (tokens × 256).
    """
    import torch

    torch.set_num_threads(THREADS)
    per_shape = {}
    for m, k, n in sizes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        flops = 2.0 * m * k * n
        a @ b  # warm-up (allocations, thread pool)
        reps = max(1, int(min_seconds * 20e9 / flops))  # ~min_seconds at 20 GFLOP/s
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(reps):
                a @ b
            rates.append(flops * reps / (time.perf_counter() - t0) / 1e9)
        per_shape[f"{m}x{k}x{n}"] = round(statistics.median(rates), 2)
    return {"peak_gflops": max(per_shape.values()), "per_shape_gflops": per_shape, "threads": THREADS}


def mfu(params: int, tokens: float, seconds: float, peak_gflops: float, factor: int = 6) -> float:
    """Model FLOP utilisation: factor · params · tokens / seconds / peak (6 = forward + backward, 2 = forward)."""
    if seconds <= 0 or peak_gflops <= 0:
        raise ValueError("seconds and peak_gflops must be > 0")
    return factor * params * tokens / seconds / (peak_gflops * 1e9)


def machine_info() -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()],
            "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


# ---- the workload: tokenizer, preference pairs ----------------------------------------------------------
def content_words(n: int) -> list[str]:
    return [f"w{i:04d}" for i in range(n)]


def build_tokenizer(out_dir: str) -> str:
    """A word-level tokenizer of exactly VOCAB_SIZE tokens (4 specials + format words + content words)."""
    from datamodules.tokenizers import SPECIAL_TOKENS, build_wordlevel_tokenizer

    n_content = VOCAB_SIZE - len(SPECIAL_TOKENS) - len(FORMAT_WORDS)
    tok = build_wordlevel_tokenizer(list(FORMAT_WORDS) + content_words(n_content))
    assert len(tok) == VOCAB_SIZE, len(tok)
    tok.save_pretrained(out_dir)
    return out_dir


def _sample_length(rng: random.Random, lo: int, hi: int, mu: float, sigma: float) -> int:
    while True:
        n = int(round(math.exp(rng.gauss(mu, sigma))))
        if lo <= n <= hi:
            return n


def make_pairs(n: int, seed: int, words: Optional[Sequence[str]] = None) -> list[dict]:
    """Preference pairs in the ultrafeedback hub schema, with a learnable rule and realistic length spread.

    Words w0000-w0199 are "good", w0200-w0399 "bad", the rest neutral. A response's quality is its density of
    good minus bad words plus noise; the chosen response is the better one. Prompt and response lengths are
    log-normal (many short, a long tail), and the two responses' lengths are independent, as in real data;
    every sequence (BOS + "user : <prompt> assistant :" + response + EOS) has MIN_TOKENS..MAX_TOKENS tokens.
    `words` (N_CONTENT_WORDS of them, one token each: `single_token_words`) replaces w0000... for a pretrained
    tokenizer: the same draws, so the same lengths and labels, in words that tokenizer keeps whole.
    """
    rng = random.Random(seed)
    words = content_words(N_CONTENT_WORDS) if words is None else list(words)
    if len(words) != N_CONTENT_WORDS:
        raise ValueError(f"make_pairs needs {N_CONTENT_WORDS} words, got {len(words)}")
    good, bad, neutral = words[:200], words[200:400], words[400:]
    rows = []
    overhead = 5  # BOS, "user", ":", "assistant", ":" ... + EOS
    for i in range(n):
        p_len = _sample_length(rng, 6, 60, math.log(18), 0.6)
        prompt = " ".join(rng.choice(neutral) for _ in range(p_len))
        lo = max(1, MIN_TOKENS - overhead - 1 - p_len)
        hi = MAX_TOKENS - overhead - 1 - p_len
        responses = []
        for _ in range(2):
            r_len = _sample_length(rng, lo, hi, math.log(60), 0.75)
            quality = rng.gauss(0.0, 1.0)
            p_good = min(0.3, max(0.0, 0.08 + 0.05 * quality))
            p_bad = min(0.3, max(0.0, 0.08 - 0.05 * quality))
            toks = []
            for _ in range(r_len):
                u = rng.random()
                toks.append(rng.choice(good) if u < p_good else rng.choice(bad) if u < p_good + p_bad
                            else rng.choice(neutral))
            responses.append((quality + rng.gauss(0.0, 0.3), " ".join(toks)))
        (qa, ra), (qb, rb) = responses
        chosen, rejected = (ra, rb) if qa >= qb else (rb, ra)
        msgs = [{"role": "user", "content": prompt}]
        rows.append({"prompt": prompt, "chosen": msgs + [{"role": "assistant", "content": chosen}],
                     "rejected": msgs + [{"role": "assistant", "content": rejected}],
                     "score_chosen": 2.0, "score_rejected": 1.0, "prompt_id": f"p{seed}-{i}"})
    return rows


def single_token_words(tokenizer, n: int) -> list[str]:
    """The first `n` lowercase words (3+ letters, by token id: the most frequent first) that `tokenizer` encodes as
    one token both alone and after a space, so a text of k such words is k tokens wherever a word stands (start of
    a message or after a space). Raises if the vocabulary has fewer."""
    vocab = len(tokenizer)
    texts = tokenizer.batch_decode([[i] for i in range(vocab)])
    seen, candidates = set(), []
    for text in texts:
        word = text.strip()
        if len(word) >= 3 and word.isascii() and word.isalpha() and word.islower() and word not in seen:
            seen.add(word)
            candidates.append(word)
    alone = tokenizer(candidates, add_special_tokens=False)["input_ids"]
    spaced = tokenizer([" " + w for w in candidates], add_special_tokens=False)["input_ids"]
    words = [w for w, a, b in zip(candidates, alone, spaced) if len(a) == 1 and len(b) == 1]
    if len(words) < n:
        raise ValueError(f"the tokenizer has only {len(words)} single-token words, the workload needs {n}")
    return words[:n]


def write_workload(work_dir: str, n_train: int, n_test: int, seed: int = 0, base_path: Optional[str] = None) -> dict:
    """Tokenizer + local hub-schema files (train_prefs / test_prefs) under work_dir; returns their paths.

    `base_path` (a pretrained base: `resolve_base`) uses that directory's tokenizer, and the pairs are written in its
    single-token words (`single_token_words`), so that each word is still one token.
    """
    os.makedirs(work_dir, exist_ok=True)
    if base_path is None:
        tok_dir, words, tag, max_length = os.path.join(work_dir, "tokenizer"), None, "", MAX_TOKENS + 8
        if not os.path.isfile(os.path.join(tok_dir, "tokenizer.json")):
            build_tokenizer(tok_dir)
    else:
        from datamodules.tokenizers import load_tokenizer

        tok_dir, max_length = base_path, PRETRAINED_MAX_LENGTH
        words = single_token_words(load_tokenizer(base_path), N_CONTENT_WORDS)
        tag = hashlib.sha1("\n".join(words).encode("utf-8")).hexdigest()[:10] + "-"
    data_dir = os.path.join(work_dir, f"data-{tag}{n_train}-{n_test}-{seed}")
    if not os.path.isfile(os.path.join(data_dir, "test_prefs.jsonl")):
        os.makedirs(data_dir, exist_ok=True)
        for split, n, s in (("train_prefs", n_train, seed), ("test_prefs", n_test, seed + 10_000)):
            with open(os.path.join(data_dir, f"{split}.jsonl"), "w") as f:
                for row in make_pairs(n, s, words):
                    f.write(json.dumps(row) + "\n")
    return {"tokenizer": tok_dir, "data_dir": data_dir, "cache_dir": os.path.join(work_dir, "cache"),
            "base_path": base_path, "max_length": max_length}


def preference_datamodule(paths: dict, batch_size: int, eval_batch_size: int, seed: int = 0, **kwargs):
    """Our PreferenceDataModule over the local files (all of train is trained on; 5% carved as validation)."""
    from datamodules.preference.datamodule import PreferenceDataModule

    return PreferenceDataModule(
        source="ultrafeedback", tokenizer=paths["tokenizer"], local_dirs={"ultrafeedback": paths["data_dir"]},
        max_length=paths.get("max_length", MAX_TOKENS + 8), train_subset="all", train_labels="gold",
        batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed, cache_dir=paths["cache_dir"], **kwargs)


def reward_module(tokenizer_dir: str, lr: float = 1e-3, base_path: Optional[str] = None, **kwargs):
    """Our RewardModelModule, AdamW without weight decay (as TRL's run): on the benchmark's Qwen2-style config, or
    with `base_path` on that pretrained base (fp32, last-token head: as configs/model/smollm2_student.yaml, but
    every layer trained)."""
    import torch

    from lightning_modules.reward.reward_model import RewardModelModule

    optimizer = lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=0.0)  # noqa: E731
    if base_path is None:
        return RewardModelModule(backbone="tiny-qwen2", tokenizer=tokenizer_dir, tiny_config=dict(MODEL_OVERRIDES),
                                 optimizer=optimizer, **kwargs)
    return RewardModelModule(backbone=base_path, tokenizer=tokenizer_dir, pooling="last", dtype="float32",
                             optimizer=optimizer, **kwargs)


def sequence_classifier(ours, base_path: Optional[str] = None):
    """TRL's side of the reward model: `AutoModelForSequenceClassification` (one label, no bias) with our initial
    weights: a copy of our random backbone, or the pretrained base loaded from the same directory in fp32; the score
    head is a copy of ours. It scores the last non-pad token, ours the last attended one: the same token, since the
    workload's sequences hold no pad id."""
    import copy

    import torch
    from transformers import AutoModelForSequenceClassification

    if base_path is None:
        cfg = copy.deepcopy(ours.backbone.config)
        cfg.num_labels = 1
        model = AutoModelForSequenceClassification.from_config(cfg)
        model.model.load_state_dict(ours.backbone.state_dict())
    else:
        model = AutoModelForSequenceClassification.from_pretrained(base_path, num_labels=1, dtype=torch.float32)
    with torch.no_grad():
        model.score.weight.copy_(ours.head.score.weight)
    return model


def worker_timeout(base_path: Optional[str]) -> float:
    """A worker's time limit: the random workload model's, or a pretrained base's (`resolve_base`)."""
    return WORKER_TIMEOUT if base_path is None else PRETRAINED_WORKER_TIMEOUT


def trainable_params(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ---- the base model: `--base` -----------------------------------------------------------------------------
def add_base_argument(parser) -> None:
    parser.add_argument(
        "--base", default=RANDOM_BASE,
        help=f"model both sides start from: {RANDOM_BASE!r} (default: the random-init workload model), 'smollm2' "
             "(SmolLM2-135M-Instruct, converted offline on first use: docs/models.md) or a local directory of a "
             "causal LM with its tokenizer; fp32 either way")


def resolve_base(name: str) -> Optional[str]:
    """`--base` -> None for the random workload model, else a local HF directory holding a causal LM and its
    tokenizer: "smollm2" (datamodules.tokenizers.resolve_pretrained) or a directory given as is."""
    if name == RANDOM_BASE:
        return None
    from datamodules.tokenizers import resolve_pretrained

    path = resolve_pretrained(name)
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        raise ValueError(f"--base {name!r}: {path!r} is not a local model directory (no config.json); use "
                         f"{RANDOM_BASE!r}, 'smollm2' or a directory holding a causal LM and its tokenizer")
    with open(config, encoding="utf-8") as f:
        architectures = json.load(f).get("architectures") or []
    if not any(a.endswith("ForCausalLM") for a in architectures):
        raise ValueError(f"--base {name!r}: {path!r} holds {architectures or 'no architecture'}, not a causal LM")
    return path


def reward_base_config(name: str, paths: dict) -> dict:
    """What the JSON records of the base: its name, sizes and parameter counts (the reward model's base
    transformer), sequence-length cap; for the random model also its overrides and vocabulary, as before."""
    from datamodules.tokenizers import load_tokenizer

    base_path = paths["base_path"]
    if base_path is None:
        from lightning_modules.reward.backbones import tiny_config

        pad = load_tokenizer(paths["tokenizer"]).pad_token_id
        return {"base": RANDOM_BASE, "model": MODEL_OVERRIDES, "vocab": VOCAB_SIZE,
                "base_model": model_summary(tiny_config("tiny-qwen2", VOCAB_SIZE, pad, MODEL_OVERRIDES)),
                "max_length": paths["max_length"]}
    return {"base": name, "base_path": base_path, "base_model": model_summary(base_path),
            "vocab": len(load_tokenizer(base_path)),
            "max_length": paths["max_length"], "head": "last token (ours) / last non-pad token (TRL)"}


def model_summary(config, causal_lm: bool = False) -> dict:
    """Sizes of a model (a HF config or a directory), counted on the meta device: nothing is read or allocated.
    The base transformer (what the reward model runs), or with `causal_lm` the causal LM (GRPO's policy)."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    if isinstance(config, str):
        config = AutoConfig.from_pretrained(config)
    with torch.device("meta"):
        model = (AutoModelForCausalLM if causal_lm else AutoModel).from_config(config)
    return {"model_type": config.model_type, "layers": config.num_hidden_layers, "hidden": config.hidden_size,
            "heads": config.num_attention_heads, "kv_heads": getattr(config, "num_key_value_heads", None),
            "intermediate": getattr(config, "intermediate_size", None), "vocab": config.vocab_size,
            "tied_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
            "parameters": sum(p.numel() for p in model.parameters()), "matmul_params": matmul_params(model)}


def matmul_params(model) -> int:
    """Parameters that take part in matmuls: everything but the embedding tables (lookups, not FLOPs)."""
    emb = sum(m.weight.numel() for m in model.modules() if type(m).__name__ == "Embedding")
    return sum(p.numel() for p in model.parameters()) - emb


def padding_stats(lengths_per_forward: Iterable[tuple[int, int]]) -> dict:
    """From (real tokens, processed positions) per forward: totals and the padding fraction."""
    real = proc = 0
    for r, p in lengths_per_forward:
        real, proc = real + r, proc + p
    return {"real_tokens": real, "processed_positions": proc, "padding_fraction": 1.0 - real / max(proc, 1)}


# ---- running and summarising ------------------------------------------------------------------------------
def summary(values: Sequence[float], digits: int = 3) -> dict:
    vals = [float(v) for v in values]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": round(statistics.median(vals), digits), "min": round(min(vals), digits),
            "max": round(max(vals), digits), "n": len(vals)}


def run_worker(script: str, args: Sequence[str], timeout: float = WORKER_TIMEOUT) -> dict:
    """Run `python script --worker ...` in a fresh process; its last stdout line is its JSON result."""
    cmd = [sys.executable, script, *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))
    if proc.returncode != 0:
        raise RuntimeError(f"worker {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"worker {' '.join(args)} printed no JSON:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    out = json.loads(lines[-1])
    out["process_seconds"] = round(time.perf_counter() - t0, 2)
    return out


def interleave(variants: Sequence[str], repeats: int, run: Callable[[str, int], dict],
               log: Optional[Callable[[str], None]] = None) -> dict[str, list[dict]]:
    """Runs ours, TRL, ours, TRL, ... (`repeats` rounds, round r gets seed r); results per variant."""
    results: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(repeats):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))  # alternate who goes first
        for v in order:
            res = run(v, r)
            results[v].append(res)
            if log:
                log(f"[round {r}] {v}: {json.dumps({k: x for k, x in res.items() if not isinstance(x, (list, dict))})}")
    return results


def eprint(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


class StepTimer:
    """Wall-clock marks at the end of each optimizer step; throughput over the steps after `warmup`."""

    def __init__(self, warmup: int = 2):
        self.warmup = warmup
        self.marks: list[float] = []
        self.items: list[dict] = []  # per step: pairs, real tokens, processed positions

    def mark(self, **item: Any) -> None:
        self.marks.append(time.perf_counter())
        self.items.append(item)

    def window(self) -> tuple[float, list[dict]]:
        """Seconds from the end of step `warmup` to the end of the last step, and the items of those steps."""
        if len(self.marks) <= self.warmup + 1:
            raise RuntimeError(f"only {len(self.marks)} steps timed; need more than warmup + 1 = {self.warmup + 1}")
        return self.marks[-1] - self.marks[self.warmup], self.items[self.warmup + 1:]

    def step_times(self) -> list[float]:
        return [b - a for a, b in zip(self.marks[self.warmup:], self.marks[self.warmup + 1:])]


def bt_step(model, opt, batch) -> None:
    """One plain gold Bradley-Terry optimisation step (the bare loop the step benchmarks time)."""
    import torch

    r_a, r_b = model(batch["input_ids"], batch["attention_mask"])[0].chunk(2)
    loss = -torch.nn.functional.logsigmoid(r_a - r_b).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
