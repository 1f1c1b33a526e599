"""BSR, reward centering, teacher-label temperature / smoothing and GRM (SFT, DPO, reference-free DPO) against
hand-computed values; their defaults change nothing; GRM is refused where there is no causal LM head
(docs/robust_baselines.md)."""
import math

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from transformers import AutoModelForCausalLM, BertConfig, BertModel

from callbacks.reference_model import ReferenceModelCallback
from datamodules.preference.collate import PairCollator
from datamodules.tokenizers import load_tokenizer
from lightning_modules.reward.backbones import LoraSpec
from lightning_modules.reward.losses import batch_sum_to_zero_loss, reward_centering_loss, soften_labels
from lightning_modules.reward.objectives import ConfidenceW2S, SoftBradleyTerry
from lightning_modules.reward.regularisers import GRM
from tests.helpers import quiet_trainer, tiny_data, tiny_model

LOG2 = math.log(2.0)


def _logsig(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def _bce(margin: float, q: float) -> float:
    return -(q * _logsig(margin) + (1 - q) * _logsig(-margin))


# ---- BSR and centering ---------------------------------------------------------------------------------------
def test_bsr_and_centering_terms_by_hand():
    r_a, r_b = torch.tensor([1.0, 2.0, -0.5]), torch.tensor([0.5, -1.0, 0.0])
    # mean of the 6 rewards = 2/6 = 1/3; B = 3 pairs -> 3 · (1/3)² = 1/3 (= (Σ r)² / (4B) = 4 / 12)
    assert batch_sum_to_zero_loss(r_a, r_b).item() == pytest.approx(1.0 / 3.0, abs=1e-7)
    # pair sums 1.5, 1.0, -0.5 -> (2.25 + 1 + 0.25) / 3
    assert reward_centering_loss(r_a, r_b).item() == pytest.approx(3.5 / 3.0, abs=1e-7)
    assert batch_sum_to_zero_loss(torch.tensor([1.0, -2.0]), torch.tensor([-1.0, 2.0])).item() == 0.0


# ---- label temperature and smoothing ------------------------------------------------------------------------
Q = torch.tensor([0.0, 0.25, 0.5, 0.8, 1.0])
# T = 2: σ(logit(q) / 2) = √odds / (1 + √odds): odds 1/3 -> 0.57735 / 1.57735 = 0.366025; odds 4 -> 2/3
Q_T2 = [0.0, 0.3660254, 0.5, 2.0 / 3.0, 1.0]
Q_T2_E01 = [0.9 * q + 0.05 for q in Q_T2]  # ε = 0.1: [0.05, 0.379423, 0.5, 0.65, 0.95]


def test_temperature_and_smoothing_transform_labels_to_hand_values():
    assert soften_labels(Q, 2.0).tolist() == pytest.approx(Q_T2, abs=1e-6)
    assert soften_labels(Q, 2.0, 0.1).tolist() == pytest.approx(Q_T2_E01, abs=1e-6)
    assert soften_labels(Q, 1.0, 0.2).tolist() == pytest.approx([0.1, 0.3, 0.5, 0.74, 0.9], abs=1e-6)
    # T = 0.5 sharpens: odds² -> 0.25 -> 1/9 -> 0.1; 0.8 -> 16 -> 16/17
    assert soften_labels(Q, 0.5).tolist() == pytest.approx([0.0, 0.1, 0.5, 16 / 17, 1.0], abs=1e-6)
    for t in (1e-3, 0.5, 3.0, 1e6):  # the ends stay put, nothing is NaN or inf
        out = soften_labels(Q, t, 0.05)
        assert torch.isfinite(out).all()
        assert out[0].item() == pytest.approx(0.025) and out[-1].item() == pytest.approx(0.975)
    assert soften_labels(torch.tensor([1e-30, 1 - 1e-7]), 2.0).tolist() == pytest.approx([0.0, 1.0], abs=1e-3)


def test_soft_objectives_use_the_transformed_labels():
    margin = torch.tensor([0.0, 1.0, -2.0, 0.5, 3.0])
    expected = sum(_bce(m, q) for m, q in zip(margin.tolist(), Q_T2_E01)) / 5
    naive = SoftBradleyTerry(label_temperature=2.0, label_smoothing=0.1)
    assert naive(margin, Q, 0.3).item() == pytest.approx(expected, abs=1e-6)
    # the confidence loss with c = 0 (no warm-up) is the same BCE on the transformed labels
    conf = ConfidenceW2S(aux_coef=0.0, warmup_fraction=0.0, label_temperature=2.0, label_smoothing=0.1)
    assert conf(margin, Q, 0.3).item() == pytest.approx(expected, abs=1e-6)
    # c = 1: the target is the hardened labels, chosen at the class balance of the *transformed* labels:
    # mean(q'') = 2.529423 / 5 = 0.5059 -> round(2.53) = 3 positives (Δ = 3, 1, 0.5); mean(q) = 0.51 gives 3 too
    conf1 = ConfidenceW2S(aux_coef=1.0, warmup_fraction=0.0, label_temperature=2.0, label_smoothing=0.1)
    hard = [0.0, 1.0, 0.0, 1.0, 1.0]
    assert conf1(margin, Q, 0.3).item() == pytest.approx(
        sum(_bce(m, h) for m, h in zip(margin.tolist(), hard)) / 5, abs=1e-6)


def test_label_option_defaults_are_bit_identical():
    g = torch.Generator().manual_seed(0)
    margin, q = torch.randn(64, generator=g), torch.rand(64, generator=g)
    assert soften_labels(q) is q
    assert torch.equal(SoftBradleyTerry()(margin, q, 0.5), F.binary_cross_entropy_with_logits(margin, q))
    from lightning_modules.reward.losses import confidence_w2s_loss
    conf = ConfidenceW2S(aux_coef=0.5, warmup_fraction=0.2)
    assert torch.equal(conf(margin, q, 0.1), confidence_w2s_loss(margin, q, conf.coef(0.1), "top"))


@pytest.mark.parametrize("kwargs, flag", [
    (dict(label_temperature=0.0), "label_temperature must be > 0"),
    (dict(label_temperature=-1.0), "label_temperature must be > 0"),
    (dict(label_temperature=float("inf")), "label_temperature must be > 0"),
    (dict(label_smoothing=-0.1), "label_smoothing must be in"),
    (dict(label_smoothing=1.5), "label_smoothing must be in"),
])
def test_label_options_refuse_bad_values_naming_the_flag(kwargs, flag):
    for cls in (SoftBradleyTerry, ConfidenceW2S):
        with pytest.raises(ValueError, match=f"--model.objective.init_args.{flag}"):
            cls(**kwargs)


# ---- GRM ---------------------------------------------------------------------------------------------------
def _batch(tok_dir: str, q=(1.0, 0.3)) -> dict:
    """Two pairs (prompt + response ids), right padded by the project's collator."""
    tok = load_tokenizer(tok_dir)
    examples = [
        dict(a_input_ids=[5, 6, 7, 8, 9, 10], a_response_start=3, b_input_ids=[5, 6, 7, 20, 21], b_response_start=3,
             label=q[0], index=0),
        dict(a_input_ids=[11, 12, 13, 14, 15, 16, 17], a_response_start=2, b_input_ids=[11, 12, 30, 31, 32, 33],
             b_response_start=2, label=q[1], index=1),
    ]
    return PairCollator(tok.pad_token_id)(examples)


def _hand_log_probs(model, batch: dict) -> list[float]:
    """Σ over response tokens of log softmax(logits[t − 1])[y_t], from the HF causal LM's own logits (plain loops)."""
    causal = AutoModelForCausalLM.from_config(model.backbone.config)
    causal.model.load_state_dict(model.backbone.state_dict())
    causal.lm_head.load_state_dict(model.lm_head.state_dict())
    with torch.no_grad():
        logp = torch.log_softmax(causal(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
                                 .logits.double(), dim=-1)  # (2B, T, V)
    out = []
    for row in range(batch["input_ids"].shape[0]):
        total = 0.0
        for t in range(1, batch["input_ids"].shape[1]):
            if batch["response_mask"][row, t]:
                total += logp[row, t - 1, batch["input_ids"][row, t]].item()
        out.append(total)
    return out


def _grm_model(tok_dir, backbone="tiny-qwen2", seed=0, **kw):
    pl.seed_everything(seed)
    kw.setdefault("objective", SoftBradleyTerry())
    return tiny_model(tok_dir, backbone=backbone, **kw)


def _reg(model, batch):
    _, hidden = model(batch["input_ids"], batch["attention_mask"], output_hidden_states=True)
    return _grm(model).loss(model, batch, hidden[-1])


def _grm(model):
    return next(r for r in model.regularisers if isinstance(r, GRM))


@pytest.mark.parametrize("backbone", ["tiny-qwen2", "tiny-llama"])
def test_grm_sft_term_by_hand(word_tokenizer_dir, backbone):
    model = _grm_model(word_tokenizer_dir, backbone, grm_coef=0.01, grm_beta=0.1)
    batch = _batch(word_tokenizer_dir)
    lp = _hand_log_probs(model, batch)  # a1, a2, b1, b2
    assert all(v < -5 for v in lp)  # ~3 tokens of a ~1.5k vocabulary: far from 0
    q = [1.0, 0.3]
    expected = sum(-(qi * _logsig(0.1 * a) + (1 - qi) * _logsig(0.1 * b))
                   for qi, a, b in zip(q, lp[:2], lp[2:])) / 2
    assert _reg(model, batch).item() == pytest.approx(expected, rel=1e-5)
    gold = _batch(word_tokenizer_dir, q=(1.0, 1.0))  # gold labels: the paper's −log σ(β·log π(y_c | x))
    assert _reg(model, gold).item() == pytest.approx(-(_logsig(0.1 * lp[0]) + _logsig(0.1 * lp[1])) / 2, rel=1e-5)
    # the per-token mean instead of the sum: a1 has 3 response tokens, a2 5, b1 2, b2 4
    mean = _grm_model(word_tokenizer_dir, backbone, grm_coef=0.01, grm_logp_reduction="mean")
    mean.load_state_dict(model.state_dict())
    counts = [3, 5, 2, 4]
    lpm = [v / n for v, n in zip(lp, counts)]
    expected = sum(-(qi * _logsig(0.1 * a) + (1 - qi) * _logsig(0.1 * b)) for qi, a, b in zip(q, lpm[:2], lpm[2:])) / 2
    assert _reg(mean, batch).item() == pytest.approx(expected, rel=1e-5)


def test_grm_dpo_noref_by_hand_and_total_loss_mixes_with_alpha(word_tokenizer_dir):
    model = _grm_model(word_tokenizer_dir, grm_coef=0.25, grm_form="dpo_noref", grm_beta=0.1)
    batch = _batch(word_tokenizer_dir)
    lp = _hand_log_probs(model, batch)
    expected = sum(_bce(0.1 * (a - b), qi) for qi, a, b in zip([1.0, 0.3], lp[:2], lp[2:])) / 2
    reg = _reg(model, batch)
    assert reg.item() == pytest.approx(expected, rel=1e-5)
    rewards, _ = model(batch["input_ids"], batch["attention_mask"])
    r_a, r_b = rewards.chunk(2)
    pref = SoftBradleyTerry()(r_a - r_b, batch["labels"], 0.0)
    loss = model.training_step(batch, 0)
    assert loss.item() == pytest.approx(0.75 * pref.item() + 0.25 * reg.item(), rel=1e-6)


def test_grm_dpo_against_the_initial_student_is_log2_then_moves(word_tokenizer_dir, cache_dir, tmp_path):
    """A reference equal to the student: h = 0, so the term is −log σ(0) = log 2 for any q. The fit's reference holds
    a frozen copy of the backbone and of the LM head, outside the module's parameters; then the term moves."""
    model = _grm_model(word_tokenizer_dir, grm_coef=0.5, grm_form="dpo", grm_beta=1.0, lr=1e-2)
    assert model.reference_coef == 0.5 and model.reference_head() is model.lm_head
    initial_head = model.lm_head.weight.detach().clone()
    regs, kept = [], {}

    class Record(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            regs.append(float(trainer.callback_metrics["train/grm_reg"]))

        def on_train_end(self, trainer, pl_module):
            kept["ref"] = ref_cb.reference

    ref_cb = ReferenceModelCallback()
    dm = tiny_data(word_tokenizer_dir, cache_dir, train_subset="student")
    quiet_trainer(str(tmp_path), max_steps=3, limit_val_batches=0, callbacks=[ref_cb, Record()]).fit(model, dm)
    assert regs[0] == pytest.approx(LOG2, abs=1e-6) and abs(regs[-1] - LOG2) > 1e-4
    ref = kept["ref"]
    assert torch.equal(ref.head.weight, initial_head) and not torch.equal(model.lm_head.weight, initial_head)
    assert not ref.head.weight.requires_grad
    ids = {id(p) for p in model.parameters()}
    assert id(ref.head.weight) not in ids and not ({id(p) for p in ref.model.parameters()} & ids)
    assert "lm_head.weight" in model.state_dict()


def test_grm_dpo_soft_labels_at_the_start_and_through_a_frozen_prefix(word_tokenizer_dir):
    """Step 0 with soft labels: log 2 on the plain forward and on the shared frozen prefix (upper layers only), whose
    total loss equals the plain forward's to float rounding."""
    losses = {}
    for share in (False, True):
        model = _grm_model(word_tokenizer_dir, grm_coef=0.1, grm_form="dpo", freeze_layers=1,
                           share_frozen_prefix=share, tiny_config={"num_hidden_layers": 2})
        ReferenceModelCallback().setup(None, model, "fit")
        batch = _batch(word_tokenizer_dir, q=(0.2, 0.9))
        prefix = None
        if share:
            _, hidden, prefix = model._forward_from_prefix(batch)
        else:
            _, hidden = model(batch["input_ids"], batch["attention_mask"], output_hidden_states=True)
        assert _grm(model).loss(model, batch, hidden[-1], prefix).item() == pytest.approx(LOG2, abs=1e-6)
        losses[share] = model.training_step(batch, 0).item()
    assert losses[True] == pytest.approx(losses[False], rel=1e-6)


def test_grm_dpo_with_lora_uses_the_base_with_adapters_disabled(word_tokenizer_dir):
    model = _grm_model(word_tokenizer_dir, grm_coef=0.1, grm_form="dpo", lora=LoraSpec(r=4, alpha=8))
    assert not model.lm_head.weight.requires_grad  # LoRA trains adapters only
    cb = ReferenceModelCallback()
    cb.setup(None, model, "fit")
    assert cb.reference.mode == "disable_adapter" and cb.reference.parameter_count() == 0
    assert _reg(model, _batch(word_tokenizer_dir, q=(0.7, 0.4))).item() == pytest.approx(LOG2, abs=1e-6)


# ---- the whole training step, defaults ------------------------------------------------------------------------
def test_bsr_and_centering_enter_the_training_loss(word_tokenizer_dir):
    model = _grm_model(word_tokenizer_dir, bsr_coef=0.5, center_rewards_coef=0.25)
    batch = _batch(word_tokenizer_dir)
    with torch.no_grad():
        rewards, _ = model(batch["input_ids"], batch["attention_mask"])
        loss = model.training_step(batch, 0)
    r = rewards.tolist()  # a1, a2, b1, b2
    pref = (_bce(r[0] - r[2], 1.0) + _bce(r[1] - r[3], 0.3)) / 2
    bsr = 2 * (sum(r) / 4) ** 2  # B = 2 pairs
    center = ((r[0] + r[2]) ** 2 + (r[1] + r[3]) ** 2) / 2
    assert loss.item() == pytest.approx(pref + 0.5 * bsr + 0.25 * center, rel=1e-5)


def test_defaults_change_nothing(word_tokenizer_dir):
    batch = _batch(word_tokenizer_dir)
    plain = _grm_model(word_tokenizer_dir, seed=5)
    explicit = _grm_model(word_tokenizer_dir, seed=5, bsr_coef=0.0, grm_coef=0.0, grm_form="dpo",
                          objective=SoftBradleyTerry(label_temperature=1.0, label_smoothing=0.0))
    assert plain.lm_head is None and not any(k.startswith("lm_head") for k in plain.state_dict())
    assert plain.reference_coef == 0.0 and plain.reference_head() is None
    assert plain.state_dict().keys() == explicit.state_dict().keys()
    for k, v in plain.state_dict().items():
        assert torch.equal(v, explicit.state_dict()[k]), k
    with torch.no_grad():
        rewards, _ = plain(batch["input_ids"], batch["attention_mask"])
        r_a, r_b = rewards.chunk(2)
        pref = F.binary_cross_entropy_with_logits(r_a - r_b, batch["labels"])  # the naive W2S loss, as before
        assert torch.equal(plain.training_step(batch, 0), pref)
        assert torch.equal(explicit.training_step(batch, 0), pref)


def test_reward_offset_trains_under_bsr_and_grm(word_tokenizer_dir):
    """GPT-2's final LayerNorm bias is frozen by default (it cancels in r_a − r_b) but moves BSR and GRM terms."""
    def ln_f_trainable(**kw):
        return _grm_model(word_tokenizer_dir, "tiny-gpt2", **kw).backbone.ln_f.bias.requires_grad
    assert not ln_f_trainable()
    assert ln_f_trainable(bsr_coef=1e-3) and ln_f_trainable(grm_coef=0.01)


# ---- refusals --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, flag", [
    (dict(bsr_coef=-1.0), "--model.bsr_coef must be >= 0"),
    (dict(grm_coef=1.0), r"--model.grm_coef must be in \[0, 1\)"),
    (dict(grm_coef=-0.1), r"--model.grm_coef must be in \[0, 1\)"),
    (dict(grm_coef=0.01, grm_form="ipo"), "--model.grm_form must be one of"),
    (dict(grm_coef=0.01, grm_beta=0.0), "--model.grm_beta must be > 0"),
    (dict(grm_coef=0.01, grm_logp_reduction="max"), "--model.grm_logp_reduction must be one of"),
    (dict(backbone="hf_classifier:/nowhere", tokenizer="x", grm_coef=0.01), "--model.grm_coef.*no language-model head"),
])
def test_bad_values_are_refused_naming_the_flag(word_tokenizer_dir, kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        tiny_model(word_tokenizer_dir, **kwargs)


def test_grm_refuses_encoders(word_tokenizer_dir, tmp_path):
    with pytest.raises(ValueError, match="--model.grm_coef needs a causal language model's LM head.*minilm"):
        tiny_model(None, backbone="minilm", grm_coef=0.01)
    bert = str(tmp_path / "bert")  # any BERT-style checkpoint, not only the packaged MiniLM
    BertModel(BertConfig(vocab_size=2000, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(bert)
    with pytest.raises(ValueError, match="--model.grm_coef.*'bert'.*no language-model head"):
        tiny_model(word_tokenizer_dir, backbone=bert, grm_coef=0.01)


def test_flags_through_cli_fit(tmp_path, cache_dir):
    from cli import main
    from tests.test_cli_configs import CPU, SMALL_SYNTH, SYNTH, TINY

    fit = main(["fit", "--config", CPU, "--config", TINY, "--config", SYNTH, f"--data.cache_dir={cache_dir}",
                f"--data.source_options={SMALL_SYNTH}", "--trainer.logger=false", "--trainer.max_steps=2",
                "--trainer.limit_val_batches=1",
                f"--trainer.default_root_dir={tmp_path}",
                "--model.objective=lightning_modules.reward.objectives.SoftBradleyTerry",
                "--model.objective.init_args.label_temperature=2.0", "--model.objective.init_args.label_smoothing=0.1",
                "--model.bsr_coef=0.001", "--model.grm_coef=0.01", "--model.grm_form=dpo", "--model.grm_beta=0.1"])
    model = fit.model
    assert (model.objective.label_temperature, model.objective.label_smoothing) == (2.0, 0.1)
    assert [r.spec()["init_args"] for r in model.regularisers] == [  # the shorthands' plug-ins, GRM first
        {"coef": 0.01, "form": "dpo", "beta": 0.1, "logp_reduction": "sum"}, {"coef": 0.001}]
    metrics = fit.trainer.callback_metrics
    assert float(metrics["train/bsr"]) >= 0 and float(metrics["train/grm_reg"]) > 0
    assert model.lm_head is not None and model.lm_head.out_features == model.backbone.config.vocab_size
