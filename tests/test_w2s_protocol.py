"""The one-command protocol: its table against values recomputed from the stage outputs, stage identity (reuse,
refusal, --force), the out_dir lock, validation before any work, DDP (each file written once, by rank 0), the
report's seed handling; the paper-grid configs parse and run with fast_dev_run on tiny local models."""
import glob
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import yaml

from protocols.engine.run_files import OutDirLock
from protocols.w2s.protocol import Method, StageChangedError, main as run_protocol, parse
from tests.conftest import HUB_FIXTURES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC, TARGETS = "synth_helpful_cooking", ["synth_helpful_science", "synth_helpful_travel", "synth_helpful_tech"]
SYNTH = {n: {"n_train": 160, "n_validation": 24, "n_test": 33} for n in [SRC, *TARGETS]}
TINY_TEACHER = os.path.join(ROOT, "configs/model/tiny_teacher.yaml")


def _write(tmp_path, cfg, name="protocol.yaml") -> str:
    path = str(tmp_path / name)
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def _tiny_protocol(tmp_path, tokenizer, cache, extra_args=(), **overrides) -> dict:
    """Tiny Qwen2 teacher and student (1 layer, word tokenizer), 80 pairs per half, 33 test pairs, 1 epoch."""
    common = [f"--model.tokenizer={tokenizer}", f"--data.source_options={json.dumps(SYNTH)}",
              f"--data.cache_dir={cache}", "--trainer.max_epochs=1", "--data.max_length=96", *extra_args]
    cfg = {"out_dir": str(tmp_path / "run"),
           "trainer_configs": [os.path.join(ROOT, "configs/trainer/cpu.yaml")],
           "data_configs": [os.path.join(ROOT, "configs/data/synth_helpful.yaml")],
           "teacher_configs": [TINY_TEACHER], "student_configs": [TINY_TEACHER],
           "teacher_args": common, "student_args": common, "seeds": [0], "ceiling": False, "drift": False,
           "methods": [{"name": "naive", "objective": "naive"}]}
    cfg.update(overrides)
    return cfg


def _stage_acc(out, seed, stage) -> dict[str, float]:
    """The stage's own test accuracies (percent), from the file the reward model wrote in its test run."""
    with open(os.path.join(out, f"seed{seed}", stage, "test", "test_results.json")) as f:
        return {k: 100.0 * v["acc"] for k, v in json.load(f).items() if k != "transfer"}


def _ood_mean_drift(out, seed, stage, metric, layer) -> float:
    with open(os.path.join(out, f"seed{seed}", stage, "fit", "drift.json")) as f:
        final = json.load(f)["final"]
    return float(np.mean([final[t][metric][layer] for t in TARGETS]))


def _expected_row(student: dict, teacher: dict, ceiling: dict | None) -> dict[str, float]:
    """The paper's scores of one seed, from plain accuracies: WRG, AOG per target, mean AOG, NTS, PGR."""
    wrg = student[SRC] - teacher[SRC]
    aog = {t: student[t] - teacher[t] for t in TARGETS}
    row = {f"acc/{SRC}": student[SRC], "wrg": wrg, **{f"aog/{t}": v for t, v in aog.items()},
           "aog_mean": float(np.mean(list(aog.values()))), **{f"acc/{t}": student[t] for t in TARGETS},
           "acc_ood_mean": float(np.mean([student[t] for t in TARGETS]))}
    row["nts"] = row["aog_mean"] - max(0.0, -wrg)
    if ceiling is not None:
        row["pgr"] = wrg / (ceiling[SRC] - teacher[SRC]) if ceiling[SRC] != teacher[SRC] else float("nan")
    return row


def test_protocol_table_equals_values_recomputed_from_stage_outputs(tmp_path, word_tokenizer_dir, cache_dir):
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, seeds=[0, 1], ceiling=True, drift=True,
                         methods=[{"name": "anchor", "objective": "naive", "anchor_coef": 1.0}])
    results = run_protocol(["--config", _write(tmp_path, cfg)])
    out, seeds, rows = cfg["out_dir"], [0, 1], results["rows"]
    assert list(rows) == ["teacher", "ceiling", "anchor"] and results["id_source"] == SRC
    drift_cols = ["drift/ood_mean/mse/layer1", "drift/ood_mean/cka/layer1"]
    assert results["columns"] == [f"acc/{SRC}", "wrg", *[k for t in TARGETS for k in (f"acc/{t}", f"aog/{t}")],
                                  "acc_ood_mean", "aog_mean", "nts", "pgr", *drift_cols]
    expected = {m: {} for m in rows}  # method -> column -> per-seed values
    for seed in seeds:
        teacher, ceiling = _stage_acc(out, seed, "teacher"), _stage_acc(out, seed, "ceiling")
        per_row = {"teacher": {f"acc/{SRC}": teacher[SRC], "wrg": 0.0, "aog_mean": 0.0, "nts": 0.0,
                               **{f"aog/{t}": 0.0 for t in TARGETS}, **{f"acc/{t}": teacher[t] for t in TARGETS},
                               "acc_ood_mean": float(np.mean([teacher[t] for t in TARGETS]))},
                   "ceiling": _expected_row(ceiling, teacher, None),
                   "anchor": _expected_row(_stage_acc(out, seed, "anchor"), teacher, ceiling)}
        for m in ("ceiling", "anchor"):
            per_row[m].update({c: _ood_mean_drift(out, seed, m, c.split("/")[2], "layer1") for c in drift_cols})
        for m, row in per_row.items():
            for col, value in row.items():
                expected[m].setdefault(col, []).append(value)
    with open(os.path.join(out, "results.json")) as f:
        written = json.load(f)["rows"]
    for m, cols in expected.items():
        for col in results["columns"]:
            if col not in cols:  # the teacher has no PGR and no drift: an empty cell
                assert col not in rows[m] and col not in written[m], (m, col)
                continue
            values = np.array(cols[col])
            cell = rows[m][col]
            assert [cell["per_seed"][s] for s in seeds] == pytest.approx(values, abs=1e-6), (m, col)
            assert cell["mean"] == pytest.approx(values.mean(), abs=1e-6), (m, col)
            assert cell["std"] == pytest.approx(values.std(ddof=1), abs=1e-6), (m, col)
            assert written[m][col]["mean"] == pytest.approx(values.mean(), abs=1e-6), (m, col)
            assert written[m][col]["per_seed"] == {str(s): pytest.approx(v, abs=1e-6) for s, v in zip(seeds, values)}
    # the Markdown row of the student, from the recomputed values
    cells = []
    for col in results["columns"]:
        values = np.array(expected["anchor"][col])
        mean, std = values.mean(), values.std(ddof=1)
        if col == "pgr" or col.startswith("drift/"):
            cells.append(f"{mean:.3g} ± {std:.2g}")
        else:
            cells.append(("" if col.startswith("acc") or mean < 0 else "+") + f"{mean:.1f} ± {std:.1f}")
    md = open(os.path.join(out, "results.md")).read()
    assert "| anchor | " + " | ".join(cells) + " |" in md
    assert "Mean ± std over 2 seeds; accuracies" in md
    for seed in seeds:  # the teacher's error structure, as the student stage's data module measured it
        labels = results["teacher_labels"][seed]
        assert labels["pairs"] > 0 and 0.0 <= labels["error_rate"] <= 1.0 and "agreement_with_artifact" in labels
    assert "The teacher's labels on the student half" in md and "Mean [95% t-interval over seeds]" in md
    for name in ("results.csv", "figures/aog_heatmap.png", "figures/nts_bars.png", "figures/drift_vs_ood.png"):
        assert os.path.isfile(os.path.join(out, name)), name
    assert len(glob.glob(os.path.join(out, "results", "summary", "events.out.tfevents.*"))) == 1
    for seed in seeds:  # a finished stage keeps only the checkpoint its result names (keep_fit_checkpoints: false)
        for stage in rows:
            folder = os.path.join(out, f"seed{seed}", stage)
            with open(os.path.join(folder, "result.json")) as f:
                kept = json.load(f)["checkpoint"]
            left = glob.glob(os.path.join(folder, "**", "*.ckpt"), recursive=True)
            assert {os.path.realpath(p) for p in left} == {os.path.realpath(kept)}, (stage, left)


def test_stage_identity_refuses_changed_configuration_and_force_reruns(tmp_path, word_tokenizer_dir, cache_dir):
    student_yaml = str(tmp_path / "student.yaml")
    model = yaml.safe_load(open(TINY_TEACHER))
    yaml.safe_dump(model, open(student_yaml, "w"))
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, student_configs=[student_yaml])
    run_protocol(["--config", _write(tmp_path, cfg)])
    out = cfg["out_dir"]
    result = {s: os.path.join(out, "seed0", s, "result.json") for s in ("teacher", "naive")}
    md = open(os.path.join(out, "results.md")).read()
    assert "1 seed" in md and "±" not in md  # one seed: values, no spread
    stamp = lambda: {s: os.path.getmtime(p) for s, p in result.items()}  # noqa: E731
    before, kept = stamp(), open(result["naive"]).read()

    # Same path, other contents: the student's model file now has 2 layers and lr 5e-2.
    model["model"]["init_args"]["tiny_config"]["num_hidden_layers"] = 2
    model["model"]["init_args"]["optimizer"]["init_args"]["lr"] = 5e-2
    yaml.safe_dump(model, open(student_yaml, "w"))
    with pytest.raises(StageChangedError) as err:
        run_protocol(["--config", _write(tmp_path, cfg)])
    message = str(err.value)
    assert os.path.join(out, "seed0", "naive") in message and os.path.join(out, "seed0", "teacher") not in message
    assert "config.model.init_args.optimizer.init_args.lr: 0.001 → 0.05" in message
    assert "config.model.init_args.tiny_config.num_hidden_layers: 1 → 2" in message
    assert "--force" in message and stamp() == before and open(result["naive"]).read() == kept

    # Another checkpoint choice is another stage.
    with pytest.raises(StageChangedError, match="checkpoint: 'last' → 'best'"):
        run_protocol(["--config", _write(tmp_path, dict(cfg, student_checkpoint="best"))])

    # --force <stage> reruns the stage it names only; then the new identity is reused.
    with pytest.raises(ValueError, match=r"--force names unknown stage\(s\) \['nieve'\]"):
        run_protocol(["--config", _write(tmp_path, cfg), "--force", "nieve"])
    run_protocol(["--config", _write(tmp_path, cfg), "--force", "naive"])
    after = stamp()
    assert after["teacher"] == before["teacher"] and after["naive"] > before["naive"]
    identity = json.load(open(result["naive"]))["identity"]["config"]
    assert identity["model.init_args.optimizer.init_args.lr"] == 5e-2
    run_protocol(["--config", _write(tmp_path, cfg)])
    assert stamp() == after

    # A teacher that ran again (its result was removed) is another upstream input of the student.
    os.remove(result["teacher"])
    with pytest.raises(StageChangedError, match=r"seed0/naive: upstream\.teacher\.run: '[0-9a-f]+' → '[0-9a-f]+'"):
        run_protocol(["--config", _write(tmp_path, cfg)])
    assert os.path.isfile(result["teacher"]) and stamp()["naive"] == after["naive"]


def test_an_option_added_since_at_its_default_is_no_change_of_a_finished_stage():
    from protocols.engine.stage_identity import identity_changes as _changes

    data = "datamodules.preference.datamodule.PreferenceDataModule"
    old = {"data.class_path": data, "data.init_args.seed": 0, "trainer.max_epochs": 2}
    finished = {"identity": {"config": old, "checkpoint": "last", "upstream": {}}}
    now = lambda **extra: {"config": {**old, **extra}, "checkpoint": "last", "upstream": {}}  # noqa: E731
    # keys the finished stage never recorded, at the code's declared defaults: the same stage
    assert _changes(finished, now(**{"data.init_args.label_temperature": 1.0, "trainer.accumulate_grad_batches": 1})) == []
    # away from the default, or an unknown key: a change, named
    assert _changes(finished, now(**{"data.init_args.label_temperature": 0.0})) == [
        "config.data.init_args.label_temperature: '(absent)' → 0.0"]
    assert _changes(finished, now(**{"data.init_args.no_such_option": 1})) == [
        "config.data.init_args.no_such_option: '(absent)' → 1"]
    # a recorded key that changed is a change even when the new value is the default
    changed = {"identity": {"config": {**old, "data.init_args.label_temperature": 0.0}, "checkpoint": "last",
                            "upstream": {}}}
    assert _changes(changed, now(**{"data.init_args.label_temperature": 1.0})) == [
        "config.data.init_args.label_temperature: 0.0 → 1.0"]


def test_ddp_protocol_writes_each_file_once_and_every_rank_computes_the_table(tmp_path, word_tokenizer_dir,
                                                                             cache_dir):
    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu"]
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, extra_args=ddp, ceiling=True)
    args = [sys.executable, os.path.join(ROOT, "tests", "ddp_protocol_script.py"), str(tmp_path),
            "--config", _write(tmp_path, cfg)]
    env = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
    run = lambda: subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)  # noqa: E731
    proc = run()
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = cfg["out_dir"]
    ranks = [json.load(open(tmp_path / f"table.rank{r}.json")) for r in (0, 1)]
    assert ranks[0] == ranks[1] == json.load(open(os.path.join(out, "results.json")))["rows"]
    assert list(ranks[0]) == ["teacher", "ceiling", "naive"]
    # the report is printed once: its id_val table (nothing swept: weak_val's is the same, said in one line), its
    # budget table
    assert proc.stdout.count("| method | ID acc |") == 1 and proc.stdout.count("| method | fits |") == 1
    assert proc.stdout.count("the table is the `id_val` table above, cell for cell") == 1
    for stage in ("teacher", "ceiling", "naive"):
        lines = open(os.path.join(out, "seed0", stage, "commands.sh")).read().splitlines()
        assert [line.split()[2] for line in lines] == ["fit", "test"], stage
    assert not glob.glob(os.path.join(out, "**", "*.tmp*"), recursive=True)
    assert not os.path.exists(os.path.join(out, ".lock"))

    # A re-run under DDP: the re-executed rank reuses the same finished stages as rank 0 (same identities).
    naive = os.path.join(out, "seed0", "naive", "result.json")
    os.remove(naive)
    kept = {s: os.path.getmtime(os.path.join(out, "seed0", s, "result.json")) for s in ("teacher", "ceiling")}
    proc = run()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert kept == {s: os.path.getmtime(os.path.join(out, "seed0", s, "result.json")) for s in kept}
    assert os.path.isfile(naive)
    assert len(open(os.path.join(out, "seed0", "naive", "commands.sh")).read().splitlines()) == 2
    again = [json.load(open(tmp_path / f"table.rank{r}.json")) for r in (0, 1)]
    assert again[0] == again[1]


# ---- the lock ---------------------------------------------------------------------------------------------------
def test_lock_refuses_a_second_run_naming_the_holder(tmp_path, word_tokenizer_dir, cache_dir):
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir)
    holder = f"PID {os.getpid()} on host {socket.gethostname()}"
    with OutDirLock(cfg["out_dir"]):
        with pytest.raises(RuntimeError, match=f"is in use by another protocol run \\({holder}"):
            run_protocol(["--config", _write(tmp_path, cfg)])
    assert not glob.glob(os.path.join(cfg["out_dir"], "seed*"))
    assert not os.path.exists(os.path.join(cfg["out_dir"], ".lock"))  # released when its holder is done


def test_stale_lock_is_taken_over_with_a_warning(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its PID names no running process now
    lock = tmp_path / ".lock"
    lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    with pytest.warns(UserWarning, match=f"taking over the stale lock .* of PID {dead.pid} on host"):
        with OutDirLock(str(tmp_path)):
            assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()


def test_lock_is_released_on_exception(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with OutDirLock(str(tmp_path)):
            raise KeyboardInterrupt
    assert not (tmp_path / ".lock").exists()
    with OutDirLock(str(tmp_path)):  # free again
        pass


# ---- validation before any work ----------------------------------------------------------------------------------
@pytest.mark.parametrize("method, message", [
    ({"name": "neg", "anchor_coef": -1.0}, r"seed0/neg \(method 'neg'\): --model.anchor_coef must be >= 0"),
    ({"name": "typo", "objective": "naiv"}, r"method 'typo': objective: unknown objective 'naiv'; registered:"),
    ({"name": "low", "anchor_coef": 1.0, "anchor_layers": [0.4]},
     r"seed0/low \(method 'low'\): --model.anchor_layers \[0.4\]: depth fraction\(s\) \[0.4\] round to hidden "
     r"state 0 of a 1-layer backbone .* the embedding output"),
    ({"name": "frozen", "anchor_coef": 1.0, "args": ["--model.freeze_layers=1"]},
     r"seed0/frozen \(method 'frozen'\): .*freezes the embeddings and layers 1..1: their anchor is identically 0"),
    ({"name": "conf", "objective": "confidence", "objective_args": {"aux_coef": 2.0}},
     r"seed0/conf \(method 'conf'\): --model.objective .*ConfidenceW2S: .*aux_coef must be in \[0, 1\]"),
], ids=["negative_lambda", "unknown_objective", "anchor_on_embeddings", "anchor_on_frozen_layer", "objective_args"])
def test_bad_method_is_refused_before_any_stage_runs(tmp_path, word_tokenizer_dir, cache_dir, method, message):
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, seeds=[0, 1],
                         methods=[{"name": "naive"}, method])
    with pytest.raises(ValueError, match=message):
        run_protocol(["--config", _write(tmp_path, cfg)])
    assert not glob.glob(os.path.join(cfg["out_dir"], "seed*", "teacher"))


def test_unknown_dataset_is_refused_naming_the_stage(tmp_path, word_tokenizer_dir, cache_dir):
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir)
    cfg["student_args"] = cfg["student_args"] + ['--data.ood_targets=["synth_helpful_cooking_x"]']
    with pytest.raises(ValueError, match=r"seed0/naive \(method 'naive'\): --data.ood_targets: unknown preference "
                                         r"source 'synth_helpful_cooking_x'"):
        run_protocol(["--config", _write(tmp_path, cfg)])
    assert not glob.glob(os.path.join(cfg["out_dir"], "seed*", "teacher"))


@pytest.mark.parametrize("objective, cls", [
    ("naive", "SoftBradleyTerry"), ("confidence", "ConfidenceW2S"), ("gold", "GoldBradleyTerry"),
    ("ConfidenceW2S", "ConfidenceW2S"), ("lightning_modules.reward.objectives.SoftBradleyTerry", "SoftBradleyTerry"),
])
def test_method_objective_takes_registry_or_class_names(objective, cls):
    from protocols.engine.stage_identity import resolve_cli_config

    args = Method("m", objective=objective, objective_args={}).cli_args()
    assert json.loads(args[0].split("=", 1)[1])["class_path"] == f"lightning_modules.reward.objectives.{cls}"
    config = resolve_cli_config(["--config", os.path.join(ROOT, "configs/data/synth_helpful.yaml"), "--config",
                                 TINY_TEACHER, *args])  # cli.py accepts the argument
    assert config["model"]["init_args"]["objective"]["class_path"] == f"lightning_modules.reward.objectives.{cls}"


def test_anchor_fraction_rounding_to_the_embeddings_says_so(word_tokenizer_dir):
    from tests.helpers import tiny_model

    with pytest.raises(ValueError) as err:  # 2 layers: round(0.01 * 2) = 0, the embedding output
        tiny_model(word_tokenizer_dir, anchor_coef=1.0, anchor_layers=[0.01, 1.0])
    message = str(err.value)
    assert ("depth fraction(s) [0.01] round to hidden state 0 of a 2-layer backbone (index round(f * 2)), the "
            "embedding output, not a transformer layer. Choose fractions >= 0.5 (layer 1)") in message
    assert "freezes" not in message
    with pytest.raises(ValueError, match=r"freezes the embeddings and layers 1..1: their anchor is identically 0. "
                                         r"Choose fractions >= 1 \(layer 2\)"):
        tiny_model(word_tokenizer_dir, anchor_coef=1.0, anchor_layers=[0.5, 1.0], freeze_layers=1)
    assert tiny_model(word_tokenizer_dir, anchor_coef=1.0, anchor_layers=[0.5, 1.0]).anchor_layer_ids == [1, 2]


# ---- the report --------------------------------------------------------------------------------------------------
def _stage(student, teacher):
    return {"test": {"transfer": {
        "acc_student": {"S": student[0], "T": student[1]}, "acc_teacher": {"S": teacher[0], "T": teacher[1]},
        "wrg": student[0] - teacher[0], "aog": {"T": student[1] - teacher[1]},
        "aog_mean": student[1] - teacher[1], "nts": student[1] - teacher[1] - max(0.0, teacher[0] - student[0])}}}


TEACHER = {"test": {"S": {"acc": 0.8, "pairs": 10}, "T": {"acc": 0.5, "pairs": 10}}}


def test_report_aggregates_seeds_as_mean_and_std():
    from protocols.w2s.report import aggregate, display_columns, markdown_table

    raw = {"teacher": {0: TEACHER, 1: TEACHER},
           "naive": {0: _stage((82.0, 40.0), (80.0, 50.0)), 1: _stage((86.0, 44.0), (80.0, 50.0))}}
    table = aggregate(raw, "S")
    assert table["naive"]["wrg"]["mean"] == 4.0 and table["naive"]["wrg"]["std"] == pytest.approx(2 ** 0.5 * 2)
    assert table["naive"]["wrg"]["per_seed"] == {0: 2.0, 1: 6.0}
    assert table["naive"]["aog/T"]["mean"] == -8.0 and table["naive"]["aog/T"]["per_seed"] == {0: -10.0, 1: -6.0}
    assert table["teacher"]["acc/S"]["mean"] == pytest.approx(80.0) and table["teacher"]["wrg"]["mean"] == 0.0
    md = markdown_table(table, display_columns("S", ["T"], False, []), 2)
    assert "Mean ± std over 2 seeds; accuracies" in md
    assert "| naive | 84.0 ± 2.8 | +4.0 ± 2.8 | 42.0 ± 2.8 | -8.0 ± 2.8 | -8.0 ± 2.8 | -8.0 ± 2.8 |" in md


def test_report_of_one_seed_prints_values_without_spread():
    from protocols.w2s.report import aggregate, display_columns, markdown_table

    table = aggregate({"teacher": {0: TEACHER}, "naive": {0: _stage((82.0, 40.0), (80.0, 50.0))}}, "S")
    assert table["naive"]["wrg"] == {"mean": 2.0, "std": None, "n": 1, "ci95": None, "per_seed": {0: 2.0}}
    md = markdown_table(table, display_columns("S", ["T"], False, []), 1)
    assert md.startswith("1 seed; accuracies (ID acc, OOD acc) in %, gains (WRG, AOG, NTS) in percent points.")
    assert "±" not in md
    assert "| naive | 82.0 | +2.0 | 40.0 | -10.0 | -10.0 | -10.0 |" in md  # OOD acc 40 = the teacher's 50 − 10
    assert "| teacher | 80.0 | +0.0 | 50.0 | +0.0 | +0.0 | +0.0 |" in md


def test_report_intervals_are_student_t_over_seeds():
    from protocols.w2s.report import aggregate, interval_table

    # WRG per seed 2, 6, 4: mean 4, std 2, t(0.975, 2) = 4.303 -> half-width 4.303·2/√3 = 4.969
    raw = {"teacher": {s: TEACHER for s in range(3)},
           "naive": {0: _stage((82.0, 40.0), (80.0, 50.0)), 1: _stage((86.0, 44.0), (80.0, 50.0)),
                     2: _stage((84.0, 45.0), (80.0, 50.0))}}
    table = aggregate(raw, "S")
    lo, hi = table["naive"]["wrg"]["ci95"]
    assert (lo, hi) == (pytest.approx(4.0 - 4.969, abs=1e-3), pytest.approx(4.0 + 4.969, abs=1e-3))
    # AOG −10, −6, −5: mean −7, std 2.646 -> ± 6.572: the interval [−13.6, −0.4] excludes 0
    assert table["naive"]["aog/T"]["ci95"] == (pytest.approx(-13.572, abs=1e-3), pytest.approx(-0.428, abs=1e-3))
    md = interval_table(table, ["T"])
    assert "| naive | +4.0 [-1.0, +9.0] (+2.0, +6.0, +4.0) | -7.0 [-13.6, -0.4] (-10.0, -6.0, -5.0) |" in md


def test_report_correlates_drift_with_ood_accuracy_over_weak_label_students_only():
    from protocols.w2s.figures import drift_ood_correlation
    from protocols.w2s.report import aggregate

    def stage(ood, mse):
        st = _stage((85.0, ood), (80.0, 50.0))
        st["drift"] = {"ood_mean": {"mse": {"layer6": mse}, "cka": {"layer6": 0.9}}}
        return st

    raw = {"teacher": {0: TEACHER, 1: TEACHER},
           "ceiling": {0: stage(99.0, 9.0), 1: stage(98.0, 8.0)},  # most drift, best OOD: must not count
           "naive": {0: stage(40.0, 3.0), 1: stage(42.0, 2.0)},
           "confidence": {0: stage(50.0, 2.0), 1: stage(47.0, 1.5)},
           "anchor": {0: stage(60.0, 1.0), 1: stage(61.0, 0.5)}}
    c = drift_ood_correlation(aggregate(raw, "S"), ["T"])
    assert c["methods"] == ["naive", "confidence", "anchor"] and c["points"] == 6
    xs, ys = [3.0, 2.0, 1.0], [40.0, 50.0, 60.0]  # seed 0: exactly linear, r = −1
    assert c["per_seed"][0] == pytest.approx(-1.0)
    assert c["per_seed"][1] == pytest.approx(float(np.corrcoef([2.0, 1.5, 0.5], [42.0, 47.0, 61.0])[0, 1]))
    pooled = np.corrcoef(xs + [2.0, 1.5, 0.5], ys + [42.0, 47.0, 61.0])[0, 1]
    assert c["pooled"] == pytest.approx(float(pooled))


def test_report_tabulates_the_teachers_label_structure_per_seed():
    from protocols.w2s.teacher_report import teacher_label_structure, teacher_label_table

    labels = {"pairs": 800, "error_rate": 0.14, "confidence_when_wrong": 0.71, "confidence_when_right": 0.93,
              "errors_with_artifact_on_rejected": 0.8}
    raw = {"teacher": {0: TEACHER}, "ceiling": {0: {"teacher_labels": {"error_rate": 9.0}}},
           "naive": {0: {"teacher_labels": labels}}}
    assert teacher_label_structure(raw) == {0: labels}
    md = teacher_label_table({0: labels})
    assert "| 0 | 0.140 | 0.800 | 0.710 | 0.930 |" in md


# ---- the shipped configs -----------------------------------------------------------------------------------------
PAPER = sorted(p for p in glob.glob(os.path.join(ROOT, "configs/experiment/paper/*.yaml"))
               if not p.endswith("grid.yaml"))  # the grid of them: tests/test_grid.py


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


def test_lambda_curve_takes_the_plain_lambda_methods_and_reports_their_seeds(tmp_path):
    """The λ curve is the methods that differ from naive only by λ (λ = 0 is naive), joined over runs and cut to the
    seeds every point has; a hard-label or confidence method is not a point of it. Cells: mean ± std (per seed)."""
    from protocols.w2s.lambda_curve import main as lambda_curve

    cell = lambda *v: {"mean": sum(v) / len(v), "std": float(np.std(v, ddof=1)),  # noqa: E731
                       "per_seed": {str(i): x for i, x in enumerate(v)}}
    main = {"methods": [
        {"name": "naive", "objective": "SoftBradleyTerry", "anchor_coef": 0.0, "args": []},
        {"name": "conf", "objective": "ConfidenceW2S", "objective_args": {"aux_coef": 0.5}, "anchor_coef": 0.0},
        {"name": "anchor", "objective": "SoftBradleyTerry", "anchor_coef": 100.0,
         "args": ["--reference.cache_outputs=true"]}]}
    ablation = {"methods": [
        {"name": "naive_hard", "objective": "SoftBradleyTerry", "anchor_coef": 0.0,
         "args": ["--data.label_temperature=0"]},
        {"name": "lam1", "objective": "SoftBradleyTerry", "anchor_coef": 1.0},
        # rows that differ from naive by more than λ (issue 36's kinds): no points of the curve
        {"name": "best_single", "objective": "SoftBradleyTerry", "anchor_coef": 0.0, "sweep": {"teacher": ["a", "b"]}},
        {"name": "warm", "objective": "SoftBradleyTerry", "anchor_coef": 0.0, "ensemble": {"of": ["lam1"]}},
        {"name": "steps", "objective": "SoftBradleyTerry", "anchor_coef": 0.0, "test_every_validation": True},
        {"name": "es", "objective": "SoftBradleyTerry", "anchor_coef": 0.0, "checkpoint": "best"}]}
    runs = {"main": (main, {"naive": (80.0, 82.0, 90.0), "conf": (1.0, 1.0, 1.0), "anchor": (83.0, 85.0, 99.0)}),
            "abl": (ablation, {"naive_hard": (81.0, 83.0), "lam1": (84.0, 86.0)})}
    for name, (protocol, accs) in runs.items():
        rows = {m: {"acc/src": cell(*a), "wrg": cell(*[x - 79.0 for x in a]), "nts": cell(*[x - 82.0 for x in a])}
                for m, a in accs.items()}
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({"id_source": "src", "rows": rows}))
        (tmp_path / name / "protocol.json").write_text(json.dumps(protocol))
        (tmp_path / name / "set.json").write_text(json.dumps({"stages": {}}))  # a set folder that read no stage
    text = lambda_curve(["--out_dir", str(tmp_path / "main"), "--out_dir", str(tmp_path / "abl")])
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert [line.split(" | ")[1] for line in table[2:]] == ["naive", "lam1", "anchor"]
    assert "ID acc: the student's accuracy on the ID test split (%). WRG: its ID acc − the teacher's (percent points)" in text
    # seed 2 exists only in the main run: dropped from every point
    assert table[2] == "| 0 | naive | 81.0 ± 1.4 (80.0, 82.0) | 2.0 ± 1.4 (1.0, 3.0) | -1.0 ± 1.4 (-2.0, 0.0) |"
    assert table[3] == "| 1 | lam1 | 85.0 ± 1.4 (84.0, 86.0) | 6.0 ± 1.4 (5.0, 7.0) | 3.0 ± 1.4 (2.0, 4.0) |"
    assert (tmp_path / "abl" / "figures" / "lambda_curve.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="λ = 0 is in two runs"):
        lambda_curve(["--out_dir", str(tmp_path / "main"), "--out_dir", str(tmp_path / "main")])


def test_join_rows_takes_each_row_from_its_run_on_the_shared_seeds(tmp_path):
    from protocols.w2s.join_rows import main as join_rows

    cell = lambda **v: {"mean": 0.0, "per_seed": v}  # noqa: E731  (join_rows recomputes from per_seed)
    runs = {"main": {"naive": {"acc/src": cell(**{"0": 80.0, "1": 82.0, "2": 99.0}), "wrg": cell(**{"0": 1.0, "1": 3.0, "2": 9.0}),
                               "aog/tgt": cell(**{"0": -4.0, "1": -2.0, "2": 9.0}), "nts": cell(**{"0": -1.0, "1": -3.0, "2": 9.0})}},
            "abl": {"hard": {"acc/src": cell(**{"0": 90.0, "1": 91.0}), "wrg": cell(**{"0": 2.0, "1": 2.0}),
                             "aog/tgt": cell(**{"0": 1.0, "1": 3.0}), "nts": cell(**{"0": 1.0, "1": 3.0})}}}
    for name, rows in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({"id_source": "src", "targets": ["tgt"], "rows": rows}))
        (tmp_path / name / "set.json").write_text(json.dumps({"stages": {}}))  # a set folder that read no stage
    table = join_rows(["--row", f"{tmp_path / 'main'}:naive", "--row", f"{tmp_path / 'abl'}:hard"]).splitlines()
    assert table[0].startswith("Mean ± std over seeds 0, 1;")
    assert table[4] == "| naive | 81.0 ± 1.4 | +2.0 ± 1.4 | -3.0 ± 1.4 | -2.0 ± 1.4 (-1.0, -3.0) |"
    assert table[5] == "| hard | 90.5 ± 0.7 | +2.0 ± 0.0 | +2.0 ± 1.4 | +2.0 ± 1.4 (+1.0, +3.0) |"
    with pytest.raises(SystemExit, match="no row 'x'"):
        join_rows(["--row", f"{tmp_path / 'main'}:x"])


def test_pruning_deletes_every_checkpoint_the_result_does_not_name(tmp_path):
    from protocols.w2s.fit import kept_checkpoints, prune_checkpoints

    files = ["fit/checkpoints/last.ckpt", "fit/checkpoints/epoch0-step4-acc0.5000.ckpt", "final.ckpt",
             "rule_checkpoints/weak_best.ckpt", "candidates/vocab_limit=5000/fit/checkpoints/last.ckpt",
             "result.json", "fit/events.out.tfevents.1"]
    for name in files:
        os.makedirs(os.path.dirname(tmp_path / name), exist_ok=True)
        (tmp_path / name).write_text("x")
    files.append("candidates/vocab_limit=5000/fit/checkpoints/epoch0-step2-acc0.7000.ckpt")
    (tmp_path / files[-1]).write_text("x")
    result = {"checkpoint": str(tmp_path / "fit/checkpoints/epoch0-step4-acc0.5000.ckpt"),
              "weak_val": {"checkpoint": str(tmp_path / "rule_checkpoints/weak_best.ckpt")},
              "teacher_search": {"candidates": [{"value": 5000, "checkpoint": str(tmp_path / files[-1])}]}}
    removed = prune_checkpoints(str(tmp_path), kept_checkpoints(result))
    assert removed == sorted(str(tmp_path / n) for n in ("candidates/vocab_limit=5000/fit/checkpoints/last.ckpt",
                                                           "final.ckpt", "fit/checkpoints/last.ckpt"))
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == sorted(
        ["fit/checkpoints/epoch0-step4-acc0.5000.ckpt", "rule_checkpoints/weak_best.ckpt", "result.json",
         "fit/events.out.tfevents.1", files[-1]])
    assert kept_checkpoints({"checkpoint": None}) == set()  # an outside model's stage: nothing of its own to keep


def test_keep_fit_checkpoints_reaches_every_stage_and_is_no_change_of_the_published_set(tmp_path,
                                                                                       word_tokenizer_dir, cache_dir):
    from protocols.w2s.config import W2SProtocol
    from protocols.w2s.publish import RUN_ONLY
    from protocols.w2s.stages import plan_stages

    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, seeds=[0], methods=[{"name": "naive"}])
    assert {s.keep_fit_checkpoints for s in plan_stages(parse(["--config", _write(tmp_path, cfg)]))} == {False}
    cfg["keep_fit_checkpoints"] = True
    assert {s.keep_fit_checkpoints for s in plan_stages(parse(["--config", _write(tmp_path, cfg)]))} == {True}
    assert RUN_ONLY <= set(W2SProtocol.__dataclass_fields__)
