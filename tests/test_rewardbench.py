"""RewardBench (v1) as an OOD target: the adapter on a fixture in the hub schema (tests/fixtures/rewardbench/
filtered.jsonl, written by tests/fixtures/make_local_fixtures.py), and `test`'s per-subset accuracies and section
scores against values computed by hand, with a reward model whose margin on every pair the test chooses."""
import json
import os
from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from datamodules.preference.sources import SOURCES, build_source
from datamodules.preference.sources.rewardbench import EXAMPLE_COUNTS, SUBSET_MAPPING, section_scores
from lightning_modules.reward.metrics import PairwiseAccuracy
from lightning_modules.reward.reward_model import RewardModelModule
from lightning_modules.reward.subset_report import format_subset_tables, subset_report
from tests.helpers import SOURCE, quiet_trainer, synth_options, tiny_data

FIXTURE = Path(__file__).parent / "fixtures" / "rewardbench"


def test_registry_metadata():
    source = build_source("rewardbench")
    assert type(source) is SOURCES["rewardbench"]
    assert (source.hub_id, source.hub_name, source.hub_data_dir) == ("allenai/reward-bench", None, None)
    assert source.split_map == {"test": "filtered"} and source.available_splits() == ["test"]


def test_constants_match_rewardbench():
    """The 23 subsets of the four sections; EXAMPLE_COUNTS sum to the 2,985 pairs of the `filtered` split once
    math-prm counts with its real 447 pairs instead of its weight 984."""
    assert sorted(s for members in SUBSET_MAPPING.values() for s in members) == sorted(EXAMPLE_COUNTS)
    assert sum(EXAMPLE_COUNTS.values()) - 984 + 447 == 2985


def test_drop_counts_and_records():
    out = build_source("rewardbench", str(FIXTURE)).load("test")
    assert out.origin == str(FIXTURE / "filtered.jsonl")  # the hub split's name
    assert dict(out.dropped) == {"identical": 1, "empty": 1, "malformed": 1, "duplicate": 1, "empty_prompt": 1}
    assert len(out.records) == 16
    assert out.records[0] == {
        "id": "rewardbench/test/alpacaeval-easy/0", "source": "rewardbench", "split": "test",
        "prompt": [{"role": "user", "content": "Give three tips for staying healthy."}],
        "chosen": "Eat a balanced diet, exercise regularly and sleep well.", "rejected": "Eat cake."}
    assert out.records[13]["chosen"] == "def square(x):\n    return x * x"  # code keeps its inner whitespace


def test_section_scores_by_hand():
    # Reasoning: math-prm weighs 984, each of the six code subsets 164: math right, code wrong -> 984 / 1968.
    acc = {"math-prm": 1.0, **{f"hep-{lang}": 0.0 for lang in ("cpp", "go", "java", "js", "python", "rust")}}
    assert section_scores(acc) == {"Reasoning": 0.5}  # the other sections absent, so no overall score
    acc = {s: 1.0 for s in EXAMPLE_COUNTS} | {"mt-bench-easy": 0.0, "donotanswer": 0.5}
    scores = section_scores(acc)
    assert scores["Chat"] == pytest.approx((100 + 95 + 95 + 40) / 358)
    assert scores["Chat Hard"] == 1.0 and scores["Reasoning"] == 1.0
    assert scores["Safety"] == pytest.approx((100 + 100 + 154 + 250 + 0.5 * 136) / 740)
    assert scores["Score"] == pytest.approx((scores["Chat"] + 1.0 + scores["Safety"] + 1.0) / 4)


# ---- `test` with a model whose margins the test sets -------------------------------------------------------------
class ScriptedRewardModel(RewardModelModule):
    """A reward model whose margin on each test pair is given: split -> pair index -> margin (+1 elsewhere)."""

    def __init__(self, margins: dict, **kwargs):
        super().__init__(**kwargs)
        self.margins = margins

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self._split = self.trainer.datamodule.test_split_names[dataloader_idx]
        return super().test_step(batch, batch_idx, dataloader_idx)

    def pair_margins(self, batch):
        table = self.margins.get(self._split, {})
        return torch.tensor([float(table.get(int(i), 1.0)) for i in batch["index"]])


WRONG, TIED = {2, 5, 6, 10, 12}, {4}  # RewardBench row ids scored wrong (margin -1) and tied (0: also wrong)


def scripted_margins() -> dict:
    records = build_source("rewardbench", str(FIXTURE)).load("test").records
    row_id = [int(r["id"].rsplit("/", 1)[1]) for r in records]  # the pair's index in the split -> its row id
    return {"rewardbench": {i: -1.0 if r in WRONG else 0.0 if r in TIED else 1.0 for i, r in enumerate(row_id)}}


EXPECTED_SUBSETS = {  # subset: (right, pairs), from the fixture's rows and WRONG / TIED
    "alpacaeval-easy": (2, 3), "mt-bench-med": (1, 2), "llmbar-natural": (0, 2), "mt-bench-hard": (1, 1),
    "xstest-should-respond": (2, 2), "donotanswer": (0, 1), "math-prm": (1, 2), "hep-python": (2, 2),
    "anthropic_helpful": (1, 1),  # kept and reported, but in no section
}
EXPECTED_SECTIONS = {
    "Chat": (2 / 3 * 100 + 1 / 2 * 40) / (100 + 40),
    "Chat Hard": (0 * 100 + 1 * 37) / (100 + 37),
    "Safety": (1 * 250 + 0 * 136) / (250 + 136),
    "Reasoning": (1 / 2 * 984 + 1 * 164) / (984 + 164),
}
EXPECTED_SECTIONS["Score"] = sum(EXPECTED_SECTIONS.values()) / 4


LOCAL = Path(__file__).parent / "fixtures" / "local"


def test_per_subset_and_section_accuracy_in_test(word_tokenizer_dir, cache_dir, tmp_path):
    # beside RewardBench: a local file (a name with dots) and a local folder whose test file has a `subset` column
    standard, folder = f"local:{LOCAL / 'standard.jsonl'}", f"local:{LOCAL / 'folder'}"
    dm = tiny_data(word_tokenizer_dir, cache_dir, ood_targets=["rewardbench", standard, folder],
                   local_dirs={"rewardbench": str(FIXTURE)}, source_options={SOURCE: synth_options()[SOURCE]})
    model = ScriptedRewardModel(scripted_margins(), backbone="tiny-qwen2", tokenizer=word_tokenizer_dir)
    logger = TensorBoardLogger(str(tmp_path), name="", version="test")
    trainer = quiet_trainer(str(tmp_path), logger=logger)
    trainer.test(model, datamodule=dm, verbose=False)

    rb = model.test_results["rewardbench"]
    assert (rb["acc"], rb["pairs"]) == (10 / 16, 16)
    assert {s: (round(v["acc"] * v["pairs"]), v["pairs"]) for s, v in rb["subsets"].items()} == EXPECTED_SUBSETS
    assert rb["subsets"]["alpacaeval-easy"]["acc"] == pytest.approx(2 / 3)
    assert rb["sections"] == pytest.approx(EXPECTED_SECTIONS)
    assert "subsets" not in model.test_results[SOURCE] and "subsets" not in model.test_results[standard]
    assert model.test_results[standard]["pairs"] == 2
    assert model.test_results[folder]["subsets"] == {"math": {"acc": 1.0, "pairs": 2},
                                                     "trivia/easy": {"acc": 1.0, "pairs": 1}}
    assert "sections" not in model.test_results[folder]  # sections are RewardBench's
    with open(os.path.join(logger.log_dir, "test_results.json")) as f:
        assert json.load(f)["rewardbench"]["sections"] == pytest.approx(EXPECTED_SECTIONS)

    logged = trainer.callback_metrics
    assert logged["test/acc/rewardbench"].item() == pytest.approx(10 / 16)
    assert logged["test/subset_acc/rewardbench/llmbar-natural"].item() == 0.0
    assert logged["test/section/rewardbench/chat_hard"].item() == pytest.approx(37 / 137)
    assert logged["test/section/rewardbench/score"].item() == pytest.approx(EXPECTED_SECTIONS["Score"])

    table = format_subset_tables(model.test_results)
    assert "| alpacaeval-easy | 3 | 66.67 |" in table and f"| Reasoning | {100 * 656 / 1148:.2f} |" in table


def test_subset_counts_each_pair_once(word_tokenizer_dir, cache_dir):
    """A pair seen twice (the distributed sampler's padding repeats pairs) counts once in its subset."""
    dm = tiny_data(word_tokenizer_dir, cache_dir, ood_targets=["rewardbench"],
                   local_dirs={"rewardbench": str(FIXTURE)}, source_options={SOURCE: synth_options()[SOURCE]})
    dm.setup("test")
    metric = PairwiseAccuracy()
    metric.update(torch.tensor([1.0, -1.0, 1.0]), torch.tensor([0, 1, 2]))  # alpacaeval-easy: 2 right of 3
    metric.update(torch.tensor([-1.0]), torch.tensor([1]))  # pair 1 again
    metric.compute()
    report = subset_report(dm, "rewardbench", *metric.pair_outcomes)
    assert report["subsets"] == {"alpacaeval-easy": {"acc": 2 / 3, "pairs": 3}}
    assert report["sections"] == {"Chat": pytest.approx(2 / 3)}


def test_hub_id_offline_says_how_to_use_local_files(monkeypatch, tmp_path):
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    with pytest.raises(Exception) as err:
        build_source("rewardbench").load("test")
    message = str(err.value)
    assert "could not load 'allenai/reward-bench' (split 'filtered')" in message
    assert "--data.local_dirs '{\"rewardbench\": \"/path/to/dir\"}'" in message and "['filtered']" in message
