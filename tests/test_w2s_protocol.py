"""The one-command protocol: stages, re-run skipping, the results tables; the paper-grid configs parse and run
with fast_dev_run when pointed at tiny local models and fixture data."""
import glob
import json
import os

import pytest
import yaml

from protocols.w2s import main as run_protocol, parse
from tests.conftest import HUB_FIXTURES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYNTH = {n: {"n_train": 160, "n_validation": 24, "n_test": 33} for n in
         ["synth_helpful_cooking", "synth_helpful_science", "synth_helpful_travel", "synth_helpful_tech"]}


def _write(tmp_path, cfg) -> str:
    path = str(tmp_path / "protocol.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def test_protocol_runs_skips_finished_stages_and_writes_tables(tmp_path, word_tokenizer_dir, cache_dir):
    common = [f"--model.tokenizer={word_tokenizer_dir}", f"--data.source_options={json.dumps(SYNTH)}",
              f"--data.cache_dir={cache_dir}", "--trainer.max_epochs=1", "--data.max_length=96"]
    cfg = {
        "out_dir": str(tmp_path / "run"),
        "trainer_configs": [os.path.join(ROOT, "configs/trainer/cpu.yaml")],
        "data_configs": [os.path.join(ROOT, "configs/data/synth_helpful.yaml")],
        "teacher_configs": [os.path.join(ROOT, "configs/model/tiny_teacher.yaml")],
        "student_configs": [os.path.join(ROOT, "configs/model/tiny_teacher.yaml")],
        "teacher_args": common, "student_args": common + ["--model.objective=lightning_modules.reward.objectives.SoftBradleyTerry"],
        "seeds": [0],
        "methods": [{"name": "anchor", "anchor_coef": 1.0}],
    }
    results = run_protocol(["--config", _write(tmp_path, cfg)])
    rows = results["rows"]
    assert list(rows) == ["teacher", "ceiling", "anchor"]
    src = "synth_helpful_cooking"
    row = rows["anchor"]
    # WRG is the student's ID accuracy minus the teacher's, on the same pairs, in percent points
    assert row["wrg"]["mean"] == pytest.approx(row[f"acc/{src}"]["mean"] - rows["teacher"][f"acc/{src}"]["mean"])
    assert row["nts"]["mean"] == pytest.approx(row["aog_mean"]["mean"] - max(0.0, -row["wrg"]["mean"]))
    ceiling_id = rows["ceiling"][f"acc/{src}"]["mean"]
    teacher_id = rows["teacher"][f"acc/{src}"]["mean"]
    if ceiling_id != teacher_id:
        assert row["pgr"]["mean"] == pytest.approx(row["wrg"]["mean"] / (ceiling_id - teacher_id))
    assert "drift/ood_mean/cka/layer1" in row  # the drift callback's final values reach the table
    out = cfg["out_dir"]
    for name in ("results.json", "results.csv", "results.md", "figures/aog_heatmap.png", "figures/nts_bars.png",
                 "figures/drift_vs_ood.png"):
        assert os.path.isfile(os.path.join(out, name)), name
    assert glob.glob(os.path.join(out, "summary", "events.out.tfevents.*"))
    md = open(os.path.join(out, "results.md")).read()
    assert "| anchor |" in md and "NTS" in md and "AOG synth_helpful_travel" in md
    assert open(os.path.join(out, "seed0", "anchor", "commands.sh")).read().startswith("python cli.py fit")

    # A re-run skips every finished stage: remove one stage's result and only that stage runs again.
    os.remove(os.path.join(out, "seed0", "anchor", "result.json"))
    stamp = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(out, "seed*", "*", "result.json"))}
    again = run_protocol(["--config", _write(tmp_path, cfg)])
    assert all(os.path.getmtime(p) == t for p, t in stamp.items())
    assert again["rows"]["anchor"]["wrg"]["mean"] == pytest.approx(row["wrg"]["mean"])  # deterministic re-run

    # A finished stage of another configuration is refused, not silently reused, and left as it was.
    changed = dict(cfg, student_args=cfg["student_args"] + ["--trainer.max_epochs=2"])
    kept = open(os.path.join(out, "seed0", "ceiling", "result.json")).read()
    with pytest.raises(ValueError, match="written by a run with other arguments"):
        run_protocol(["--config", _write(tmp_path, changed)])
    assert open(os.path.join(out, "seed0", "ceiling", "result.json")).read() == kept


def test_report_aggregates_seeds_as_mean_and_std(tmp_path):
    from protocols.w2s_report import aggregate, markdown_table, display_columns

    def stage(student, teacher):
        return {"test": {"transfer": {
            "acc_student": {"S": student[0], "T": student[1]}, "acc_teacher": {"S": teacher[0], "T": teacher[1]},
            "wrg": student[0] - teacher[0], "aog": {"T": student[1] - teacher[1]},
            "aog_mean": student[1] - teacher[1], "nts": 0.0}}}

    teacher = {"test": {"S": {"acc": 0.8, "pairs": 10}, "T": {"acc": 0.5, "pairs": 10}}}
    raw = {"teacher": {0: teacher, 1: teacher},
           "naive": {0: stage((82.0, 40.0), (80.0, 50.0)), 1: stage((86.0, 44.0), (80.0, 50.0))}}
    table = aggregate(raw, "S")
    assert table["naive"]["wrg"]["mean"] == 4.0 and table["naive"]["wrg"]["std"] == pytest.approx(2 ** 0.5 * 2)
    assert table["naive"]["aog/T"]["mean"] == -8.0
    assert table["teacher"]["acc/S"]["mean"] == pytest.approx(80.0) and table["teacher"]["wrg"]["mean"] == 0.0
    md = markdown_table(table, display_columns("S", ["T"], False, []), 2)
    assert "| naive | 84.0 ± 2.8 | +4.0 ± 2.8 | -8.0 ± 2.8 |" in md


PAPER = sorted(glob.glob(os.path.join(ROOT, "configs/experiment/paper/*.yaml")))


@pytest.mark.parametrize("path", PAPER + sorted(glob.glob(os.path.join(ROOT, "configs/experiment/*.yaml"))),
                         ids=lambda p: os.path.relpath(p, ROOT))
def test_protocol_configs_parse(path):
    p = parse(["--config", path])
    assert p.methods and p.seeds


@pytest.mark.parametrize("name", ["qwen_hh_helpful", "llama_pku_saferlhf"])
def test_paper_configs_fast_dev_run_on_tiny_models(name, tmp_path, word_tokenizer_dir, cache_dir):
    cfg = yaml.safe_load(open(os.path.join(ROOT, "configs/experiment/paper", f"{name}.yaml")))
    data = yaml.safe_load(open(os.path.join(ROOT, cfg["data_configs"][0])))["data"]["init_args"]
    local = {n: os.path.join(HUB_FIXTURES, n) for n in [data["source"], *data["ood_targets"]]}
    family = "tiny-llama" if name.startswith("llama") else "tiny-qwen2"
    tiny = [f"--model.backbone={family}", f"--model.tokenizer={word_tokenizer_dir}", "--model.dtype=null",
            f"--data.local_dirs={json.dumps(local)}", f"--data.cache_dir={cache_dir}", "--data.val_fraction=0.3",
            "--trainer.fast_dev_run=true", "--trainer.accelerator=cpu", "--trainer.devices=1",
            "--trainer.strategy=auto", "--trainer.precision=32"]
    anchor = next(m for m in cfg["methods"] if m.get("anchor_coef"))
    cfg.update(out_dir=str(tmp_path / "run"), seeds=[0], teacher_args=tiny, student_args=tiny, ceiling=False,
               methods=[anchor], drift=False,
               trainer_configs=[os.path.join(ROOT, c) for c in cfg["trainer_configs"]],
               data_configs=[os.path.join(ROOT, c) for c in cfg["data_configs"]],
               teacher_configs=[os.path.join(ROOT, c) for c in cfg["teacher_configs"]],
               student_configs=[os.path.join(ROOT, c) for c in cfg["student_configs"]])
    results = run_protocol(["--config", _write(tmp_path, cfg)])
    assert set(results["rows"]) == {"teacher", anchor["name"]}
    assert results["rows"][anchor["name"]]["nts"]["per_seed"][0] == pytest.approx(
        results["rows"][anchor["name"]]["aog_mean"]["per_seed"][0]
        - max(0.0, -results["rows"][anchor["name"]]["wrg"]["per_seed"][0]))
