"""Weak labels: q = σ(Δ_teacher / T) on the student half, in the recorded per-pair order, T = 0 hard."""
import math

import pytest
import torch

from datamodules.preference.datamodule import tempered
from datamodules.preference.weak_labels import swap_order
from tests.helpers import tiny_data, tiny_teacher_checkpoint


def test_tempered_labels_by_hand():
    q = 1 / (1 + math.exp(-0.8))  # Δ = 0.8
    assert tempered(q, 1.0) == q
    assert tempered(q, 0.5) == pytest.approx(1 / (1 + math.exp(-1.6)))
    assert tempered(q, 2.0) == pytest.approx(1 / (1 + math.exp(-0.4)))
    assert (tempered(q, 0.0), tempered(1 - q, 0.0), tempered(0.5, 0.0)) == (1.0, 0.0, 0.5)
    assert (tempered(1.0, 0.5), tempered(0.0, 3.0)) == (1.0, 0.0)


@pytest.fixture
def teacher_ckpt(tmp_path_factory, word_tokenizer_dir, cache_dir):
    return tiny_teacher_checkpoint(tmp_path_factory, word_tokenizer_dir, cache_dir)


@pytest.mark.parametrize("temperature", [1.0, 0.5, 0.0])
def test_student_labels_are_the_tempered_teacher_margins(word_tokenizer_dir, cache_dir, teacher_ckpt, temperature):
    from lightning_modules.reward.reward_model import RewardModelModule

    dm = tiny_data(word_tokenizer_dir, cache_dir, train_subset="student", teacher_checkpoint=teacher_ckpt,
                   label_temperature=temperature)
    dm.prepare_data()
    dm.setup("fit")
    teacher = RewardModelModule.load_from_checkpoint(teacher_ckpt, map_location="cpu").eval()
    ds = dm.datasets["train_student"]
    batch = dm._collator()([ds[i] for i in range(24)])
    with torch.no_grad():
        margins = teacher.pair_margins(batch)  # (B,): r(a) − r(b) in the batch's (possibly swapped) order
    expected = torch.sigmoid(margins / temperature) if temperature > 0 else (margins > 0).float()
    torch.testing.assert_close(batch["labels"].float(), expected, atol=2e-5, rtol=0)
    swaps = [swap_order(ds.cols["id"][i], dm.hparams.seed) for i in range(24)]
    assert 0 < sum(swaps) < len(swaps)  # both orders occur: the label is not "a is always chosen"


def test_label_temperature_must_be_non_negative(word_tokenizer_dir, cache_dir):
    with pytest.raises(ValueError, match="--data.label_temperature must be >= 0"):
        tiny_data(word_tokenizer_dir, cache_dir, train_subset="student", label_temperature=-1.0)
