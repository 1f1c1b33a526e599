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


# ---- `--base` (issue 37): a pretrained base on both sides, here a tiny random Llama shaped like SmolLM2 ---------
SMOL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # pad/unk, bos, eos: SmolLM2's ids 0, 1, 2
CHATML = ("{% for m in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}{% endif %}"
          "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory) -> str:
    """A SmolLM2-like base directory: byte-level BPE tokenizer (2,205 three-letter words, each one token alone and
    after a space; ChatML template with a default system prompt; pad <|endoftext|> = 0, eos <|im_end|>) and a tiny
    random Llama with tied embeddings."""
    import itertools

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["".join(w) for w in itertools.product("bcdfghjklmnpqrstvwxyz", "aeiou", "bcdfghjklmnpqrstvwxyz")]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(words + [" " + w for w in words], trainers.BpeTrainer(
        vocab_size=20_000, special_tokens=SMOL_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<|endoftext|>", unk_token="<|endoftext|>",
                                  bos_token="<|im_start|>", eos_token="<|im_end|>")
    tok.chat_template = CHATML
    out = str(tmp_path_factory.mktemp("tiny_base"))
    tok.save_pretrained(out)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    return out


def test_resolve_base(tiny_base, tmp_path, monkeypatch):
    """--base: "random" -> None (the workload model), a directory as is, "smollm2" through the packaged-model
    resolver; a folder without a model or with an encoder is refused naming the flag."""
    import datamodules.pretrained_models as pm

    assert C.resolve_base("random") is None
    assert C.resolve_base(tiny_base) == tiny_base
    monkeypatch.setitem(pm.PACKAGED_MODELS, "smollm2", lambda: tiny_base)  # never the real conversion here
    assert C.resolve_base("smollm2") == tiny_base
    with pytest.raises(ValueError, match="--base .*no config.json"):
        C.resolve_base(str(tmp_path / "missing"))
    (tmp_path / "config.json").write_text('{"architectures": ["BertModel"]}')
    with pytest.raises(ValueError, match="--base .*not a causal LM"):
        C.resolve_base(str(tmp_path))


def test_model_summary_counts_without_weights(tiny_base):
    from transformers import AutoModel, AutoModelForCausalLM

    base, lm = AutoModel.from_pretrained(tiny_base), AutoModelForCausalLM.from_pretrained(tiny_base)
    emb = base.get_input_embeddings().weight.numel()
    out = C.model_summary(tiny_base)
    assert out["parameters"] == sum(p.numel() for p in base.parameters())
    assert out["matmul_params"] == out["parameters"] - emb
    assert (out["model_type"], out["layers"], out["hidden"], out["kv_heads"]) == ("llama", 2, 32, 2)
    # tied embeddings: the causal LM's head adds no parameter
    assert C.model_summary(tiny_base, causal_lm=True)["parameters"] == sum(p.numel() for p in lm.parameters())
    assert sum(p.numel() for p in lm.parameters()) == out["parameters"]


def test_pretrained_workload_keeps_words_whole(tiny_base, tmp_path):
    """The pairs for a pretrained base: the same draws as the word-level workload (word counts, order, labels) in
    words its tokenizer keeps whole, so each prompt and response is as many tokens as words."""
    from datamodules.tokenizers import load_tokenizer

    tok = load_tokenizer(tiny_base)
    words = C.single_token_words(tok, C.N_CONTENT_WORDS)
    assert len(set(words)) == C.N_CONTENT_WORDS
    assert all(len(tok.encode(w, add_special_tokens=False)) == 1 == len(tok.encode(" " + w, add_special_tokens=False))
               for w in words)
    with pytest.raises(ValueError, match="single-token words"):
        C.single_token_words(tok, 10_000)
    plain, mapped = C.make_pairs(12, seed=3), C.make_pairs(12, seed=3, words=words)
    index = {w: i for i, w in enumerate(C.content_words(C.N_CONTENT_WORDS))}
    for a, b in zip(plain, mapped):
        for key in ("chosen", "rejected"):
            text_a, text_b = a[key][-1]["content"], b[key][-1]["content"]
            assert [words[index[w]] for w in text_a.split()] == text_b.split()  # the same draw, another spelling
            assert len(tok(text_b, add_special_tokens=False)["input_ids"]) == len(text_b.split())
        assert len(tok(b["prompt"], add_special_tokens=False)["input_ids"]) == len(b["prompt"].split())
    paths = C.write_workload(str(tmp_path), 20, 4, seed=0, base_path=tiny_base)
    assert paths["tokenizer"] == paths["base_path"] == tiny_base and paths["max_length"] == C.PRETRAINED_MAX_LENGTH
    random_paths = C.write_workload(str(tmp_path), 20, 4, seed=0)
    assert random_paths["base_path"] is None and random_paths["max_length"] == C.MAX_TOKENS + 8
    assert random_paths["data_dir"].endswith("data-20-4-0") and paths["data_dir"] != random_paths["data_dir"]
    assert "trl" not in sys.modules


def test_reward_sides_match_on_a_pretrained_base(tiny_base):
    """Like with like: ours (base + last-token head) and TRL's AutoModelForSequenceClassification on the same
    directory train the same parameters and give the same rewards on a right-padded batch (pad 0, eos last)."""
    import torch

    ours = C.reward_module(tiny_base, lr=1e-5, base_path=tiny_base).eval()
    theirs = C.sequence_classifier(ours, tiny_base).eval()
    n_ours, n_theirs = C.trainable_params(ours), C.trainable_params(theirs)
    assert n_ours == n_theirs == sum(p.numel() for p in ours.parameters())  # full fine-tuning on both sides
    assert next(theirs.parameters()).dtype == torch.float32 and ours.head.pooling == "last"
    ids = torch.tensor([[1, 40, 41, 42, 43, 2], [1, 50, 51, 2, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        r_ours, _ = ours(ids, mask)
        r_theirs = theirs(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
    torch.testing.assert_close(r_ours, r_theirs, rtol=1e-5, atol=1e-5)
    assert "trl" not in sys.modules


def test_grpo_prompt_ids_equal_on_both_sides(tiny_base, tmp_path):
    """TRL gets our prompt ids: the chat template + generation prompt (pretrained base) or BOS + text (the family's
    word-level tokenizer); the runtime check on TRL's own tokenization accepts equal ids and refuses others."""
    import json
    import types

    from benchmarks import bench_grpo as G
    from datamodules.triggers.datamodule import encode_prompt

    args = types.SimpleNamespace(prompts=2, steps=1, work_dir=str(tmp_path))
    for tokenizer in (tiny_base, None):
        dm = G.trigger_dm(args, 0, tokenizer)
        dm.setup("fit")
        tok, texts = dm.tokenizer, [it["prompt"] for it in dm.train_items]
        ours = [encode_prompt(tok, t) for t in texts]
        prompts = G.trl_prompts(tok, texts)
        assert G.trl_prompt_ids(tok, prompts) == ours
        if tokenizer is not None:
            assert isinstance(prompts[0], list) and tok.decode(ours[0]).endswith("<|im_start|>assistant\n")
            assert tok.decode(ours[0]).startswith("<|im_start|>system\nYou are a tiny test model")
        else:
            assert isinstance(prompts[0], str) and ours[0][0] == tok.bos_token_id

    expected = {json.dumps(p): ids for p, ids in zip(prompts, ours)}
    trainer = types.SimpleNamespace(_tokenize_prompts=lambda ps: (G.trl_prompt_ids(tok, ps), None, {}))
    checked = G.check_trl_prompt_ids(trainer, expected)
    assert not checked
    assert trainer._tokenize_prompts(prompts)[0] == ours and checked
    wrong = types.SimpleNamespace(_tokenize_prompts=lambda ps: ([ids[1:] for ids in ours], None, {}))
    G.check_trl_prompt_ids(wrong, expected)
    with pytest.raises(AssertionError, match="prompt ids differ"):
        wrong._tokenize_prompts(prompts)
    assert "trl" not in sys.modules


def test_sampler_bench_workers_on_the_random_base(tmp_path):
    """bench_sampler.py's workers in-process on the random base: the module's sample call per sampler counts the
    real tokens (EOS included, no padding), `--ignore-eos` gives exactly max_new_tokens per completion, and greedy
    decoding gives the same tokens with all three samplers."""
    import types

    from benchmarks import bench_sampler as S

    args = types.SimpleNamespace(base="random", work_dir=str(tmp_path), prompts=2, group_size=2, max_new_tokens=5,
                                 temperature=1.0, steps=2, warmup=1, ignore_eos=False, greedy_prompts=3, seed=0)
    greedy = S.worker_greedy(args)
    assert greedy["greedy_equal"] and greedy["prompts"] == 3
    assert greedy["rows_differing_from_hf_generate"] == {"static": [], "kv_loop": []}
    for sampler in S.SAMPLERS:
        for ignore_eos in (False, True):
            args.variant, args.ignore_eos = sampler, ignore_eos
            out = S.worker_sampler(args)
            completions = args.steps * args.prompts * args.group_size
            assert out["calls_timed"] == args.steps and out["tokens_per_s"] > 0
            assert 1 <= out["mean_completion_tokens"] <= args.max_new_tokens
            assert out["generated_tokens"] == round(out["mean_completion_tokens"] * completions)
            if ignore_eos:
                assert out["generated_tokens"] == completions * args.max_new_tokens and out["eos_share"] == 0
    assert "trl" not in sys.modules
