"""The quick start's example files: TRL's standard layout, read back by the `local:` source exactly as written."""
import json

from datamodules.preference.example_files import write_example_files
from datamodules.preference.sources.base import build_source


def test_example_files_are_trl_pairs_the_local_source_reads(tmp_path):
    paths = write_example_files(str(tmp_path), n_train=30, n_test=12, seed=3)
    rows = [json.loads(line) for line in open(paths["train"])]
    assert len(rows) == 30 and set(rows[0]) == {"prompt", "chosen", "rejected"}
    assert all(r["chosen"] != r["rejected"] for r in rows)
    assert sum(1 for _ in open(paths["test"])) == 12 and sum(1 for _ in open(paths["ood"])) == 12

    train = build_source(f"local:{tmp_path}/my_pairs").load("train")
    assert [r["chosen"] for r in train.records] == [r["chosen"] for r in rows]
    assert train.records[0]["prompt"] == [{"role": "user", "content": rows[0]["prompt"]}]
    # the shifted file is another domain's questions, not the source's
    ood = [json.loads(line)["prompt"] for line in open(paths["ood"])]
    assert not set(ood) & {r["prompt"] for r in rows}


def test_same_seed_same_files_other_seed_other_pairs(tmp_path):
    a = write_example_files(str(tmp_path / "a"), n_train=10, n_test=5, seed=0)
    b = write_example_files(str(tmp_path / "b"), n_train=10, n_test=5, seed=0)
    c = write_example_files(str(tmp_path / "c"), n_train=10, n_test=5, seed=1)
    assert open(a["train"]).read() == open(b["train"]).read()
    assert open(a["train"]).read() != open(c["train"]).read()
