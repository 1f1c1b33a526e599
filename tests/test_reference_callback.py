"""The frozen reference lives in ReferenceModelCallback: unchanged by training, outside state_dict, checkpoint and
optimizer, exactly the student at the first step, rebuilt from the initial weights on resume; LoRA adds no copy."""
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from callbacks.reference_model import ReferenceModelCallback
from lightning_modules.reward.backbones import LoraSpec
from tests.helpers import quiet_trainer, tiny_data, tiny_model


class AnchorRecorder(Callback):
    def __init__(self):
        self.anchor, self.reference_state = [], None

    def on_train_start(self, trainer, pl_module):
        ref = next(cb for cb in trainer.callbacks if isinstance(cb, ReferenceModelCallback)).reference
        self.reference_state = None if ref is None or ref.model is None else {
            k: v.clone() for k, v in ref.model.state_dict().items()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if "train/anchor_loss" in trainer.callback_metrics:
            self.anchor.append(float(trainer.callback_metrics["train/anchor_loss"]))


def _fit(tok, cache, root, model, steps=4, callbacks=(), **kw):
    ref = ReferenceModelCallback()
    rec = AnchorRecorder()
    trainer = quiet_trainer(root, max_steps=steps, limit_val_batches=0, callbacks=[ref, rec, *callbacks], **kw)
    trainer.fit(model, tiny_data(tok, cache))
    return trainer, ref, rec


def test_anchor_is_zero_at_first_step_then_positive_and_reference_frozen(word_tokenizer_dir, cache_dir, tmp_path):
    pl.seed_everything(0)
    model = tiny_model(word_tokenizer_dir, anchor_coef=10.0)
    initial = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    ref_cb = ReferenceModelCallback()
    rec = AnchorRecorder()
    kept = {}

    class KeepReference(Callback):
        def on_train_end(self, trainer, pl_module):
            kept["ref"] = ref_cb.reference.model
            kept["optimizer_params"] = {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}
            kept["ckpt"] = trainer._checkpoint_connector.dump_checkpoint()

    trainer = quiet_trainer(str(tmp_path), max_steps=4, limit_val_batches=0, callbacks=[ref_cb, rec, KeepReference()])
    trainer.fit(model, tiny_data(word_tokenizer_dir, cache_dir))
    assert rec.anchor[0] == 0.0 and all(a > 0 for a in rec.anchor[1:])
    ref = kept["ref"]
    for k, v in ref.state_dict().items():
        assert torch.equal(v, initial[k]), k
    assert not any(torch.equal(v, model.backbone.state_dict()[k]) for k, v in ref.state_dict().items()
                   if v.dtype.is_floating_point and v.numel() > 1)
    ref_ids = {id(p) for p in ref.parameters()}
    assert not ref_ids & kept["optimizer_params"]
    assert not ref_ids & {id(p) for p in model.parameters()}
    n_model_tensors = len(model.state_dict())
    assert len(kept["ckpt"]["state_dict"]) == n_model_tensors  # no reference tensors in the checkpoint
    assert all(not k.startswith("reference") for k in kept["ckpt"]["state_dict"])
    assert ref_cb.reference is None  # dropped at the end of fit


def test_no_reference_without_anchor(word_tokenizer_dir, cache_dir, tmp_path):
    trainer, ref, rec = _fit(word_tokenizer_dir, cache_dir, str(tmp_path), tiny_model(word_tokenizer_dir), steps=2)
    assert rec.reference_state is None and rec.anchor == []


def test_resumed_run_anchors_to_the_initial_weights(word_tokenizer_dir, cache_dir, tmp_path):
    pl.seed_everything(3)
    model = tiny_model(word_tokenizer_dir, anchor_coef=1.0)
    initial = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True, save_top_k=0)
    _fit(word_tokenizer_dir, cache_dir, str(tmp_path / "a"), model, steps=4, callbacks=[ckpt],
         enable_checkpointing=True, max_epochs=5)
    trained = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    pl.seed_everything(3)  # the same init recipe: a pretrained checkpoint, or the same seed for random init
    resumed = tiny_model(word_tokenizer_dir, anchor_coef=1.0)
    ref = ReferenceModelCallback()
    rec = AnchorRecorder()
    quiet_trainer(str(tmp_path / "b"), max_steps=6, max_epochs=5, limit_val_batches=0, callbacks=[ref, rec]).fit(
        resumed, tiny_data(word_tokenizer_dir, cache_dir), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    for k, v in rec.reference_state.items():
        assert torch.equal(v, initial[k]), k
    assert any(not torch.equal(rec.reference_state[k], trained[k]) for k in trained)
    assert rec.anchor[0] > 0  # the resumed student has already moved away from its initial weights


def test_lora_reference_disables_adapters_without_a_copy(word_tokenizer_dir, cache_dir, tmp_path):
    pl.seed_everything(0)
    model = tiny_model(word_tokenizer_dir, anchor_coef=10.0, lora=LoraSpec(r=4, alpha=8))
    base_params = sum(p.numel() for p in model.parameters())
    ref_cb = ReferenceModelCallback()
    rec = AnchorRecorder()
    seen = {}

    class Count(Callback):
        def on_train_start(self, trainer, pl_module):
            seen["mode"] = ref_cb.reference.mode
            seen["extra"] = ref_cb.reference.parameter_count()

    quiet_trainer(str(tmp_path), max_steps=4, limit_val_batches=0, callbacks=[ref_cb, rec, Count()]).fit(
        model, tiny_data(word_tokenizer_dir, cache_dir))
    assert seen == {"mode": "disable_adapter", "extra": 0}
    assert sum(p.numel() for p in model.parameters()) == base_params
    assert rec.anchor[0] == 0.0 and rec.anchor[-1] > 0  # LoRA's B starts at zero: student = reference


def test_cached_reference_outputs_match_and_skip_later_epochs(word_tokenizer_dir, cache_dir, tmp_path):
    """cache_outputs: the same anchor losses and weights as recomputing, and no reference forward after epoch 1
    (batches are regrouped every epoch, so rows are read back from the cache in new compositions)."""
    runs = {}
    for cache in (False, True):
        pl.seed_everything(0)
        model = tiny_model(word_tokenizer_dir, anchor_coef=10.0)
        ref_cb, rec, calls = ReferenceModelCallback(cache_outputs=cache), AnchorRecorder(), []

        class CountForwards(Callback):
            def on_train_start(self, trainer, pl_module):
                # the embeddings: the full forward and the selected-positions path both run them once per forward
                ref_cb.reference.model.get_input_embeddings().register_forward_hook(
                    lambda m, i, o: calls.append(trainer.current_epoch))

        trainer = quiet_trainer(str(tmp_path / str(cache)), max_epochs=2, limit_val_batches=0,
                                callbacks=[ref_cb, rec, CountForwards()])
        dm = tiny_data(word_tokenizer_dir, cache_dir, train_subset="student")
        trainer.fit(model, dm)
        runs[cache] = rec.anchor, calls, {k: v.clone() for k, v in model.state_dict().items()}
    (plain, plain_calls, plain_w), (cached, cached_calls, cached_w) = runs[False], runs[True]
    steps_per_epoch = len(plain) // 2
    assert len(plain) == len(cached) == 2 * steps_per_epoch and max(plain) > 0
    torch.testing.assert_close(torch.tensor(cached), torch.tensor(plain), rtol=1e-4, atol=1e-7)
    for k in plain_w:
        torch.testing.assert_close(cached_w[k], plain_w[k], rtol=1e-4, atol=5e-5)  # float noise: another padding
    assert plain_calls == [0] * steps_per_epoch + [1] * steps_per_epoch
    assert cached_calls == [0] * steps_per_epoch  # epoch 2 reads every row from the cache
