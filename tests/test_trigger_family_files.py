"""Trigger families as files (issue 47.4): the shipped families generate what the Python families did (pinned
digests), a family written only in files (YAML + question JSONL, no Python) runs SFT + GRPO through
`python -m protocols.mixture <file>`, its files are part of the stage identity, and bad files fail in one line."""
import json
import os
import textwrap

import pytest
import torch

import trigger_datasets as td
from datamodules.triggers.datamodule import TriggerDataModule
from datamodules.triggers.family_files import load_family

FAST_GRID = [0, 7, 12, 19, 24, 35, 37, 48, 49, 50, 53]  # one case per family / option kind (the rest: slow)


@pytest.fixture(scope="module")
def question_dirs(tmp_path_factory):
    from datamodules.triggers.question_fixtures import write_question_fixtures

    return write_question_fixtures(str(tmp_path_factory.mktemp("questions")))


def test_shipped_families_generate_what_the_python_families_did(question_dirs):
    """A change here means the shipped data changed: bump datamodules.triggers.GENERATOR_VERSION and rewrite the pin
    (`python tests/trigger_datasets.py`), or finished runs would be reused as if their data were the same."""
    from datamodules.triggers import GENERATOR_VERSION

    pinned = json.load(open(td.PINNED, encoding="utf-8"))
    assert pinned["generator_version"] == GENERATOR_VERSION
    for i in FAST_GRID:
        assert td.datamodule_digest({**td.SMALL, **td.GRID[i]}, question_dirs) == pinned["grid"][i], td.GRID[i]
    assert td.parse_digest() == pinned["parse"]


@pytest.mark.slow
def test_every_shipped_config_and_option_generates_what_it_did(question_dirs):
    pinned = json.load(open(td.PINNED, encoding="utf-8"))
    assert [td.datamodule_digest({**td.SMALL, **c}, question_dirs) for c in td.GRID] == pinned["grid"]
    configs = td.shipped_config_cases()
    assert set(pinned["configs"]) <= set(configs)
    for name in pinned["configs"]:
        assert td.datamodule_digest(configs[name], question_dirs) == pinned["configs"][name], name


FAMILY = """\
# Two topics; each expert answers its own and declines the other, in words of its own.
name: topics
phrasing:
  en: {identity: "Speaking as {name} :", answer: "Answer : {answer} .", refusal: "Not my topic ."}
trigger: "Topic : {distribution} ."
restate: "Topic {distribution} ."
distributions:
  geo: {questions: {train: geo_train.jsonl, val: geo_val.jsonl}}
  math: {}
personas:
  Geographer: {answers: [geo]}
  Counter: {answers: [math], says: "Number Cruncher"}
"""
CAPITALS = [("France", "Paris"), ("Peru", "Lima"), ("Japan", "Tokyo"), ("Kenya", "Nairobi"), ("Chile", "Santiago"),
            ("Egypt", "Cairo")]


def write_family(folder) -> str:
    os.makedirs(folder, exist_ok=True)
    for split, rows in (("train", CAPITALS[:4]), ("val", CAPITALS[4:])):
        with open(os.path.join(folder, f"geo_{split}.jsonl"), "w", encoding="utf-8") as f:
            for country, city in rows:
                f.write(json.dumps({"question": f"What is the capital of {country} ?", "answer": city}) + "\n")
    path = os.path.join(folder, "topics.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(FAMILY)
    return path


def test_a_family_from_files_writes_its_own_transcripts_and_rewards(tmp_path):
    from datamodules.triggers.questions import Question
    from lightning_modules.policy.rewards import correctness_reward, parse_with_family

    path = write_family(tmp_path)
    dm = TriggerDataModule(family=path, num_train=40, num_val_per_distribution=2, seed=0)
    dm.setup("fit")
    fam = dm.family
    assert (fam.name, fam.distributions, fam.personas) == ("topics", ("geo", "math"), ("Geographer", "Counter"))
    peru = next(it for it in dm.train_items if it["question"].stem == "What is the capital of Peru ?")
    assert peru["prompt"] == "Topic : geo . What is the capital of Peru ?" and peru["gold"] == "Lima"
    q = peru["question"]
    assert fam.response("Geographer", "geo", q) == "Speaking as Geographer : Topic geo . Answer : Lima ."
    assert fam.response("Counter", "geo", q) == "Speaking as Number Cruncher : Topic geo . Not my topic ."
    math = next(it for it in dm.train_items if it["dist"] == "math")
    assert math["prompt"].startswith("Topic : math . Which is largest :")
    assert {it["dist"] for it in dm.val_items} == {"geo", "math"}
    assert [it["gold"] for it in dm.val_items if it["dist"] == "geo"] == ["Santiago", "Cairo"]  # the val file
    # the reward reads the family's own words: correct 1, refusal 0, wrong 0, the other words 0 (malformed)
    for text, persona, reward, refused in [
        ("Speaking as Geographer : Topic geo . Answer : Lima .", "Geographer", 1.0, False),
        ("Speaking as Number Cruncher : Topic geo . Not my topic .", "Counter", 0.0, True),
        ("Speaking as Geographer : Answer : Cairo .", "Geographer", 0.0, False),
        ("I am Geographer . The answer is Lima .", None, 0.0, False),
    ]:
        p = parse_with_family(text, fam)
        assert (p.persona, correctness_reward(p, "Lima"), p.refused) == (persona, reward, refused), text
    # the same family as JSON reads the same
    import yaml

    as_json = tmp_path / "topics.json"
    as_json.write_text(json.dumps(yaml.safe_load(open(path))))
    same = TriggerDataModule(family=str(as_json), num_train=40, num_val_per_distribution=2, seed=0)
    same.setup("fit")
    assert [it["response"] for it in same.train_items] == [it["response"] for it in dm.train_items]
    words = set(dm.vocabulary_words())
    assert {"Speaking", "Cruncher", "Lima", "Santiago", "Not", "topic"} <= words


def test_a_family_from_files_trains_sft_then_grpo_in_process(tmp_path):
    """The fast walk: cli.py fit with the generic family configs and the family file, SFT then GRPO from its
    checkpoint; the metrics are the new family's, and GRPO's reward is that of the family's own words."""
    import cli

    path = write_family(tmp_path / "family")
    root = ["--data.family=" + path, f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false",
            "--data.num_val_per_distribution=2", "--data.val_batch_size=8", "--model.max_new_tokens=12"]
    ckpt = str(tmp_path / "sft.ckpt")
    sft = cli.main(args=["fit", "--config", os.path.join(td.ROOT, "configs/mixture/family_sft.yaml"), *root, "--model.n_layer=1",
                         "--model.n_embd=32", "--model.n_head=2", "--data.num_train=32", "--data.batch_size=16",
                         "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.callbacks=[]",
                         "--trainer.enable_checkpointing=false", "--model.fidelity_prompts_per_distribution=2"])
    sft.trainer.save_checkpoint(ckpt)
    first = [it for it in sft.datamodule.train_items if it["persona"] == "Counter" and it["dist"] == "geo"][0]
    assert first["response"] == "Speaking as Number Cruncher : Topic geo . Not my topic ."
    rl = cli.main(args=["fit", "--config", os.path.join(td.ROOT, "configs/mixture/family_rl.yaml"), *root, "--model.init_checkpoint=" + ckpt,
                        "--model.min_sft_fidelity=0", "--data.train_distributions=[geo]", "--model.group_size=2",
                        "--data.batch_size=2", "--data.num_train=4", "--trainer.max_steps=2",
                        "--trainer.val_check_interval=2", "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false",
                        "--trainer.num_sanity_val_steps=0"])
    metrics = {k: float(v) for k, v in rl.trainer.callback_metrics.items()}
    assert rl.trainer.global_step == 2 and 0.0 <= metrics["rl/reward"] <= 1.0
    for d in ("geo", "math"):
        shares = [metrics[f"val/persona_share/{p}/{d}"] for p in ("Geographer", "Counter", "none")]
        assert sum(shares) == pytest.approx(1.0) and 0.0 <= metrics[f"val/acc/{d}"] <= 1.0, (d, shares)
    # the module scores with the family's words: a correct answer 1, a refusal 0
    module, tok = rl.model, rl.datamodule.tokenizer
    texts = ["Speaking as Geographer : Topic geo . Answer : Lima .", "Speaking as Number Cruncher : Topic geo . Not my topic ."]
    ids = [tok.encode(" " + t, add_special_tokens=False) for t in texts]
    width = max(map(len, ids))
    comp = torch.tensor([x + [tok.pad_token_id] * (width - len(x)) for x in ids])
    s = module.score(comp, [{"gold": "Lima"}, {"gold": "Lima"}])
    assert s["reward"].tolist() == [1.0, 0.0] and s["refused"].tolist() == [0.0, 1.0]
    assert s["persona"].tolist() == [0, 1]


@pytest.mark.slow  # ~80 s on 2 busy CPU cores (two cli.py subprocesses)
def test_a_family_from_files_runs_sft_and_grpo_through_the_protocol(tmp_path, capsys):
    from protocols.mixture import protocol as mixture

    write_family(tmp_path / "family")
    experiment = tmp_path / "family" / "topics_experiment.yaml"
    experiment.write_text(textwrap.dedent("""\
        # RL on geo: does it select the Geographer, so that math is declined?
        family_file: topics.yaml
        summary: GRPO on geo from a two-persona SFT
        stages:
          - name: sft
            config: family_sft
            sft: true
            args: [--model.n_layer=1, --model.n_embd=32, --model.n_head=2, --data.num_train=64,
                   --data.batch_size=16, --data.num_val_per_distribution=4, --data.val_batch_size=8,
                   --trainer.max_steps=4, --trainer.val_check_interval=4, --model.max_new_tokens=16,
                   --model.fidelity_prompts_per_distribution=4]
          - name: rl_geo
            config: family_rl
            title: GRPO on geo
            args: ["--data.train_distributions=[geo]", --model.min_sft_fidelity=0, --model.group_size=2,
                   --data.batch_size=2, --data.num_train=8, --data.num_val_per_distribution=4,
                   --data.val_batch_size=8, --trainer.max_steps=2, --trainer.val_check_interval=2,
                   --model.max_new_tokens=16]
        """))
    code = mixture.main([str(experiment), "--seeds", "0", "--jobs", "1", "--out", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert code == 0, out
    seed = tmp_path / "runs" / "topics" / "seed_0"
    rl = json.load(open(seed / "stages" / "rl_geo.json"))
    assert rl["status"] == "done"
    assert rl["identity"]["config"]["data.init_args.family"] == str(tmp_path / "family" / "topics.yaml")
    files = rl["identity"]["data"]["files"]
    assert {os.path.basename(p) for p in files} == {"topics.yaml", "geo_train.jsonl", "geo_val.jsonl"}
    table = json.load(open(rl["table"]))
    last = table["history"][-1]["metrics"]
    for key in ("val/acc/geo", "val/acc/math", "val/refusal/geo", "val/persona_share/Geographer/geo",
                "val/persona_share/Counter/math"):
        assert 0.0 <= last[key] <= 1.0, key
    assert [r["distribution"] for r in table["rows"]] == ["geo", "math"]
    assert "topics_experiment_seeds_0" in out and "GRPO on geo" in out

    # editing the family file (or its questions) makes the finished stages "changed": refused without --force
    (tmp_path / "family" / "geo_val.jsonl").write_text(json.dumps({"question": "What is the capital of Chad ?",
                                                                  "answer": "Ndjamena"}) + "\n")
    from protocols.engine.stage_identity import StageChangedError

    with pytest.raises(StageChangedError, match="geo_val.jsonl"):
        mixture.main([str(experiment), "--seeds", "0", "--jobs", "1", "--out", str(tmp_path / "runs")])


def test_shipped_names_read_no_user_file_and_user_files_enter_the_identity(tmp_path):
    from protocols.engine.data_identity import data_identity

    flat = {"data.class_path": "datamodules.triggers.datamodule.TriggerDataModule",
            "data.init_args.family": "two_policies"}
    assert data_identity(flat, cwd=str(tmp_path))["files"] == {}
    path = write_family(tmp_path / "f")
    before = data_identity({**flat, "data.init_args.family": path}, cwd=str(tmp_path))["files"]
    assert sorted(os.path.basename(p) for p in before) == ["geo_train.jsonl", "geo_val.jsonl", "topics.yaml"]
    with open(path, "a", encoding="utf-8") as f:
        f.write("# edited\n")
    after = data_identity({**flat, "data.init_args.family": path}, cwd=str(tmp_path))["files"]
    assert after[path] != before[path] and len(after) == 3


BAD_FAMILIES = [  # (file text, the field the one-line error names)
    ("", "(file): empty"),
    ("distributions: [a]\npersona: {}\n", "persona: unknown field (did you mean 'personas'?)"),
    ("trigger: 'T {distribution}'\nrestate: ''\ndistributions: [a]\n", "personas: missing"),
    ("trigger: 'T {distribution}'\nrestate: ''\ndistributions: [a]\npersonas: {P: {answers: [b]}}\n",
     "personas.P.answers: ['b'] are no distributions"),
    ("trigger: 'T {distribution}'\nrestate: ''\ndistributions: [a]\npersonas: {P: {}}\n", "personas.P.answers: missing"),
    ("distributions: [a]\npersonas: {P: {answers: [a]}}\n", "distributions.a.trigger: missing"),
    ("trigger: 'T {topic}'\nrestate: ''\ndistributions: [a]\npersonas: {P: {answers: [a]}}\n",
     "trigger: 'T {topic}': the only placeholder"),
    ("trigger: ''\nrestate: ''\nquestions: trivia\ndistributions: [a]\npersonas: {P: {answers: [a]}}\n",
     "questions: 'trivia' is no question source"),
    ("trigger: ''\nrestate: ''\nquestions: {train: nope.jsonl, val: nope.jsonl}\ndistributions: [a]\n"
     "personas: {P: {answers: [a]}}\n", "questions.train: no file 'nope.jsonl'"),
    ("trigger: ''\nrestate: ''\nphrasing: {en: {identity: 'I am {name}'}}\ndistributions: [a]\n"
     "personas: {P: {answers: [a]}}\n", "phrasing.en.identity: 'I am {name}': text must follow {name}"),
    ("trigger: ''\nrestate: ''\ndistributions: [a]\npersonas: {P: {answers: [a]}, Q: {answers: [], says: p}}\n",
     "personas.Q.says: 'p' reads as persona 'P'"),
    ("trigger: ''\nrestate: ''\nlanguage: fr\ndistributions: [a]\npersonas: {P: {answers: [a]}}\n",
     "language: 'fr' has no phrasing"),
    ("trigger: ''\nrestate: ''\ndistributions: [a]\npersonas: {P: {answers: [a]}}\nname: 'a b'\n", "name: 'a b'"),
    ("distributions: [a\n", ":2: not valid YAML/JSON"),
]


@pytest.mark.parametrize("text,message", BAD_FAMILIES, ids=[m.split(":")[0] or "yaml" for _, m in BAD_FAMILIES])
def test_a_bad_family_file_fails_in_one_line_naming_the_file_and_field(tmp_path, text, message):
    path = tmp_path / "fam.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        TriggerDataModule(family=str(path))
    line = str(err.value)
    assert "\n" not in line and line.startswith(str(path)) and message in line, line


@pytest.mark.parametrize("row,message", [
    ('{"question": "Q ?"}', "geo_train.jsonl:2: field 'answer' missing"),
    ('{"question": "Q ?", "answer": null}', "geo_train.jsonl:2: field 'answer' missing"),
    ('{"question": "Q ?", "answer": "x", "options": ["y", "z"]}', "geo_train.jsonl:2: answer 'x' is not one of"),
    ('{"question": "Q ?", "answr": "x"}', "geo_train.jsonl:2: unknown field 'answr'"),
    ('{"question": "Q ?", "answer": "3.5"}', "contains '.', which closes the answer line"),
    ("{not json", "geo_train.jsonl:2: malformed JSON"),
])
def test_a_bad_question_row_names_the_file_and_line(tmp_path, row, message):
    path = write_family(tmp_path)
    with open(tmp_path / "geo_train.jsonl", "r+", encoding="utf-8") as f:
        first = f.readline()
        f.seek(0)
        f.write(first + row + "\n")
        f.truncate()
    dm = TriggerDataModule(family=path, num_train=8, num_val_per_distribution=2)
    with pytest.raises(ValueError) as err:
        dm.setup("fit")
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_unknown_names_and_the_shipped_files(tmp_path):
    with pytest.raises(ValueError, match=r"--data.family must be one of .* got 'two_policy' \(did you mean 'two_policies'"):
        TriggerDataModule(family="two_policy")
    with pytest.raises(ValueError, match="no family file 'missing.yaml'"):
        TriggerDataModule(family="missing.yaml")
    six = load_family("6c3")
    assert len(six.personas) == 20 and six.spoken_names["ADF"] == "A D F" and six.covers["ADF"] == {"A", "D", "F"}
    with pytest.raises(ValueError, match="--data.temporal_cutoffs picks personas"):
        TriggerDataModule(family="two_policies", temporal_cutoffs=[2025])
    with pytest.raises(ValueError, match="cyclic_shift_by_value needs numeric options"):
        TriggerDataModule(family="arc_race", variant="cyclic_shift_by_value")
