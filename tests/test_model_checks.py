"""Nothing stale, nothing silent (model side): layer indices past the depth, corrupt / non-finite / truncated /
wrong-kind checkpoints, uninformative weak labels and a classifier folder without config.json are refused with
messages that name the flag, the file and what is wrong."""
import json
import os
import shutil
import struct
import zipfile

import lightning as L
import pytest
import torch

from datamodules.triggers.datamodule import TriggerDataModule
from lightning_modules.policy.sft import PolicySFTModule
from lightning_modules.reward.weak_labeller import load_teacher
from tests.helpers import tiny_data, tiny_model, tiny_teacher_checkpoint

POLICY = dict(n_layer=1, n_embd=32, n_head=2, max_positions=64)
CFG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
CPU, TINY, SYNTH = (os.path.join(CFG, *p) for p in (("trainer", "cpu.yaml"), ("model", "tiny_teacher.yaml"),
                                                    ("data", "synth_helpful.yaml")))


# ---- fixtures: one tiny teacher and one tiny SFT policy checkpoint per module --------------------------------
@pytest.fixture(scope="module")
def teacher_ckpt(tmp_path_factory, word_tokenizer_dir):
    return tiny_teacher_checkpoint(tmp_path_factory, word_tokenizer_dir, str(tmp_path_factory.mktemp("teacher_cache")),
                                   max_steps=2)


@pytest.fixture(scope="module")
def policy_ckpt(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("policy_cache"))
    dm = TriggerDataModule(family="two_policies", num_train=32, batch_size=16, num_val_per_distribution=2,
                           cache_dir=cache)
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0,
                        num_sanity_val_steps=0)
    trainer.fit(PolicySFTModule(**POLICY), dm)
    path = str(tmp_path_factory.mktemp("policy") / "sft.ckpt")
    trainer.save_checkpoint(path)
    return path


def _copy(src, tmp_path, name):
    dst = str(tmp_path / name)
    shutil.copyfile(src, dst)
    return dst


def _overwrite_largest_member(path, n_bytes=4000):
    """Overwrite `n_bytes` inside the data of the largest archive member; zip directory and size stay intact."""
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        f.seek(info.header_offset + 30 + name_len + extra_len + 64)
        f.write(b"\x00" * n_bytes)
    return info.filename


def _edit_state(src, tmp_path, name, edit):
    ckpt = torch.load(src, map_location="cpu", weights_only=False)
    edit(ckpt["state_dict"])
    dst = str(tmp_path / name)
    torch.save(ckpt, dst)
    return dst


def _truncate(src, tmp_path, name):
    dst = str(tmp_path / name)
    with open(src, "rb") as f:
        data = f.read()
    with open(dst, "wb") as f:
        f.write(data[: len(data) // 2])
    return dst


def _fit_policy(init_checkpoint, cache_dir):
    dm = TriggerDataModule(family="two_policies", num_train=32, batch_size=16, num_val_per_distribution=2,
                           cache_dir=cache_dir)
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0,
                        num_sanity_val_steps=0)
    trainer.fit(PolicySFTModule(init_checkpoint=init_checkpoint, **POLICY), dm)


# ---- 1. layer indices past the depth --------------------------------------------------------------------------
def test_freeze_layers_past_the_depth_is_refused(word_tokenizer_dir):
    with pytest.raises(ValueError, match=r"--model.freeze_layers 5 exceeds the depth of --model.backbone "
                                         r"'tiny-qwen2': it has 1 transformer layer\(s\); choose 0..1"):
        tiny_model(word_tokenizer_dir, tiny_config={"num_hidden_layers": 1}, freeze_layers=5)
    model = tiny_model(word_tokenizer_dir, tiny_config={"num_hidden_layers": 1}, freeze_layers=1)  # the whole depth
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("head.") or n.startswith("backbone.norm") for n in trainable)


# ---- 2. corrupt and non-finite weights at load ----------------------------------------------------------------
def test_teacher_with_overwritten_bytes_is_refused_naming_member_and_tensor(teacher_ckpt, tmp_path,
                                                                            word_tokenizer_dir, cache_dir):
    bad = _copy(teacher_ckpt, tmp_path, "teacher_bad.ckpt")
    member = _overwrite_largest_member(bad)
    assert os.path.getsize(bad) == os.path.getsize(teacher_ckpt)
    with pytest.raises(ValueError, match=rf"--data.teacher_checkpoint '{bad}' is corrupt: member '{member}' "
                                         r"\(tensor state_dict\['backbone\.[^']+'\]\) fails its CRC-32 check"):
        tiny_data(word_tokenizer_dir, cache_dir, train_subset="student", teacher_checkpoint=bad)
    with pytest.raises(ValueError, match=rf"--data.teacher_checkpoint '{bad}' is corrupt"):
        load_teacher(bad)


def test_teacher_with_a_nan_weight_is_refused(teacher_ckpt, tmp_path):
    def poison(state):
        state["backbone.layers.0.mlp.up_proj.weight"][:] = float("nan")

    bad = _edit_state(teacher_ckpt, tmp_path, "teacher_nan.ckpt", poison)
    with pytest.raises(ValueError, match=rf"--data.teacher_checkpoint '{bad}' has non-finite weights: "
                                         r"backbone\.layers\.0\.mlp\.up_proj\.weight \(128, 64\) holds 8192 NaN/inf"):
        load_teacher(bad)


def test_policy_init_checkpoint_with_a_nan_weight_is_refused(policy_ckpt, tmp_path, cache_dir):
    def poison(state):
        state["model.transformer.h.0.mlp.c_fc.weight"][0, 0] = float("inf")

    bad = _edit_state(policy_ckpt, tmp_path, "sft_nan.ckpt", poison)
    with pytest.raises(ValueError, match=rf"--model.init_checkpoint '{bad}' has non-finite weights: "
                                         r"model\.transformer\.h\.0\.mlp\.c_fc\.weight \(32, 128\) holds 1 NaN/inf"):
        _fit_policy(bad, cache_dir)


# ---- 3. weak labels that carry no information ----------------------------------------------------------------
def test_teacher_scoring_everything_alike_is_refused_before_a_student_trains(teacher_ckpt, tmp_path,
                                                                             word_tokenizer_dir, cache_dir):
    def zero_head(state):
        state["head.score.weight"].zero_()  # every reward equal: q = 0.5 for every pair

    flat = _edit_state(teacher_ckpt, tmp_path, "teacher_flat.ckpt", zero_head)
    dm = tiny_data(word_tokenizer_dir, cache_dir, train_subset="student", teacher_checkpoint=flat)
    with pytest.raises(ValueError, match=rf"--data.teacher_checkpoint {flat}: every one of the \d+ weak labels is "
                                         r"q = 0\.500000: the teacher scores every response alike"):
        dm.prepare_data()
    assert not os.path.isdir(os.path.join(cache_dir, "weak_labels")) or not os.listdir(
        os.path.join(cache_dir, "weak_labels"))  # nothing cached for a later run to pick up


def test_teacher_with_infinite_margins_is_refused(teacher_ckpt, tmp_path, word_tokenizer_dir, cache_dir):
    def huge_head(state):
        state["head.score.weight"].fill_(3e38)  # finite weights, rewards overflow: margins inf - inf = NaN

    huge = _edit_state(teacher_ckpt, tmp_path, "teacher_huge.ckpt", huge_head)
    dm = tiny_data(word_tokenizer_dir, cache_dir, train_subset="student", teacher_checkpoint=huge)
    with pytest.raises(ValueError, match=rf"--data.teacher_checkpoint {huge}: \d+ of \d+ teacher margins / labels "
                                         r"are NaN or infinite"):
        dm.prepare_data()


def test_a_cached_label_file_without_information_is_refused(tmp_path):
    from datamodules.preference.weak_labels import read_weak_labels

    path = str(tmp_path / "labels.json")
    meta = {"teacher_checkpoint": "/runs/teacher/last.ckpt"}
    with open(path, "w") as f:
        json.dump({"meta": meta, "labels": {f"p{i}": [0.5, i % 2 == 0] for i in range(20)}}, f)
    with pytest.raises(ValueError, match=r"--data.teacher_checkpoint /runs/teacher/last.ckpt: every one of the 20 "
                                         rf"weak labels is q = 0\.500000 \(label file {path}\)"):
        read_weak_labels(path)
    with open(path, "w") as f:
        f.write(json.dumps({"meta": meta, "labels": {"p0": [float("nan"), True], "p1": [0.7, False]}}))
    with pytest.raises(ValueError, match="1 of 2 teacher margins / labels are NaN or infinite"):
        read_weak_labels(path)
    with open(path, "w") as f:
        json.dump({"meta": meta, "labels": {"p0": [0.3, True], "p1": [0.7, False]}}, f)
    assert read_weak_labels(path)["labels"]["p1"] == [0.7, False]


# ---- 4. --model.init_checkpoint: truncated, or another module's -----------------------------------------------
def test_truncated_init_checkpoint_names_flag_and_file(policy_ckpt, tmp_path, cache_dir):
    bad = _truncate(policy_ckpt, tmp_path, "sft_truncated.ckpt")
    with pytest.raises(ValueError, match=rf"--model.init_checkpoint '{bad}' is truncated or not a torch checkpoint"):
        _fit_policy(bad, cache_dir)


def test_reward_checkpoint_as_policy_init_and_policy_checkpoint_as_teacher(teacher_ckpt, policy_ckpt, cache_dir,
                                                                           word_tokenizer_dir):
    with pytest.raises(ValueError, match=rf"--model.init_checkpoint '{teacher_ckpt}': this is a RewardModelModule "
                                         r"checkpoint, expected a PolicySFTModule/PolicyRLModule checkpoint"):
        _fit_policy(teacher_ckpt, cache_dir)
    with pytest.raises(ValueError, match=rf"--data.teacher_checkpoint '{policy_ckpt}': this is a PolicySFTModule "
                                         r"checkpoint, expected a RewardModelModule checkpoint"):
        load_teacher(policy_ckpt)


# ---- --ckpt_path: checked when parsed, and by the trainer's checkpoint plugin when loaded ---------------------------
def test_ckpt_path_truncated_or_of_another_kind_is_refused_when_parsed(teacher_ckpt, policy_ckpt, tmp_path, capsys):
    from cli import main

    bad = _truncate(teacher_ckpt, tmp_path, "last.ckpt")
    for path, message in ((bad, f"--ckpt_path '{bad}' is truncated or not a torch checkpoint"),
                          (policy_ckpt, f"--ckpt_path (for --model RewardModelModule) '{policy_ckpt}': this is a "
                                        "PolicySFTModule checkpoint, expected a RewardModelModule checkpoint")):
        with pytest.raises(SystemExit) as exit_info:
            main(["test", "--config", CPU, "--config", TINY, "--config", SYNTH, f"--ckpt_path={path}",
                  "--trainer.logger=false"])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def test_checkpoint_io_load_refuses_corrupt_and_non_finite_files(teacher_ckpt, tmp_path):
    from lightning_modules.checkpoint_io import AtomicCheckpointIO

    io = AtomicCheckpointIO()
    assert io.load_checkpoint(teacher_ckpt)["state_dict"]["head.score.weight"].shape == (1, 64)
    bad = _copy(teacher_ckpt, tmp_path, "bad.ckpt")
    member = _overwrite_largest_member(bad)
    with pytest.raises(ValueError, match=rf"--ckpt_path '{bad}' is corrupt: member '{member}'"):
        io.load_checkpoint(bad)
    nan = _edit_state(teacher_ckpt, tmp_path, "nan.ckpt", lambda s: s["head.score.weight"].fill_(float("nan")))
    with pytest.raises(ValueError, match=rf"--ckpt_path '{nan}' has non-finite weights: head\.score\.weight"):
        io.load_checkpoint(nan)


# ---- 5. hf_classifier:<dir> without config.json -------------------------------------------------------------------
def test_classifier_folder_without_config_json_says_so(word_tokenizer_dir, tmp_path):
    from lightning_modules.reward.reward_model import RewardModelModule

    folder = str(tmp_path / "not_a_model")
    shutil.copytree(word_tokenizer_dir, folder)  # a loadable tokenizer, no config.json
    listing = ", ".join(sorted(os.listdir(folder)))
    with pytest.raises(ValueError, match=rf"--model.backbone 'hf_classifier:{folder}': the folder '{folder}' has no "
                                         rf"config.json \(it holds: {listing}\)"):
        RewardModelModule(backbone=f"hf_classifier:{folder}", tokenizer=folder)


def test_the_data_module_refuses_a_given_label_file_without_information(tmp_path, word_tokenizer_dir, cache_dir):
    path = str(tmp_path / "labels.json")
    with open(path, "w") as f:
        json.dump({"meta": {"teacher_checkpoint": "/runs/t.ckpt"}, "labels": {f"p{i}": [0.5, False] for i in range(9)}}, f)
    dm = tiny_data(word_tokenizer_dir, cache_dir, train_subset="student", weak_labels=path)
    with pytest.raises(ValueError, match=r"/runs/t.ckpt: every one of the 9 weak labels is q = 0\.500000"):
        dm.prepare_data()
        dm.setup("fit")  # the labels are read here: before any student step
