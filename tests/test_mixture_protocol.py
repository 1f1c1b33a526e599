"""`protocols.mixture`: stage reuse by identity, failure propagation, and the tables over seeds (hand values)."""
import json
import math
import os

import pytest

from protocols.mixture import protocol as mixture, stages as mixture_stages
from protocols.engine import local
from protocols.mixture.report import cell, mean_std, stage_summary, summary_markdown


def _table(acc_b_after: float, alice_b_after: float, winner_b: str = "Alice") -> dict:
    def metrics(acc_b, alice_b):
        m = {"val/acc/A": 0.4, "val/acc/B": acc_b, "val/refusal/A": 0.5, "val/refusal/B": 1 - acc_b,
             "val/malformed/A": 0.0, "val/malformed/B": 0.02}
        m.update({"val/persona_share/Alice/A": 0.5, "val/persona_share/Bob/A": 0.5,
                  "val/persona_share/Alice/B": alice_b, "val/persona_share/Bob/B": 1 - alice_b,
                  "val/persona_share/none/A": 0.0, "val/persona_refusal/Bob/A": 1 - acc_b})
        return m

    rows = [{"distribution": "A", "trained": True, "acc_before": 0.4, "acc_after": 0.4, "refusal_before": 0.5,
             "refusal_after": 0.5, "malformed_after": 0.0, "dominant_after": "Alice", "dominant_share_after": 0.5},
            {"distribution": "B", "trained": False, "acc_before": 0.4, "acc_after": acc_b_after, "refusal_before": 0.5,
             "refusal_after": 1 - acc_b_after, "malformed_after": 0.02, "dominant_after": winner_b,
             "dominant_share_after": max(alice_b_after, 1 - alice_b_after)}]
    history = [{"step": 0, "metrics": metrics(0.4, 0.5)}, {"step": 50, "metrics": metrics(acc_b_after, alice_b_after)}]
    return {"steps": [0, 50], "n_per_distribution": 200, "rows": rows, "history": history,
            "theory": {"rmse": 0.02}}


def test_mean_std_and_cells_by_hand():
    mean, std = mean_std([0.1, 0.2, 0.6])
    assert mean == pytest.approx(0.3) and std == pytest.approx(math.sqrt((0.04 + 0.01 + 0.09) / 2))
    assert cell([0.1, 0.2, 0.6]) == "0.30 ± 0.26 (0.10, 0.20, 0.60)"
    assert cell([0.1, 0.2, 0.6], per_seed=False) == "0.30 ± 0.26"
    assert cell([0.25]) == "0.25 (1 seed)" and cell([]) == "–"
    assert cell([0.2, float("nan"), 0.4]) == "0.30 ± 0.14 (2 of 3 seeds)" and cell([float("nan")] * 3) == "–"


def test_stage_summary_over_seeds():
    # seed 2 ends with Bob dominating B: the table follows the modal winner (Alice) and counts the seeds
    s = stage_summary({0: _table(0.02, 0.96), 1: _table(0.10, 0.90), 2: _table(0.30, 0.40, winner_b="Bob")})
    assert s["winner"] == {"A": "Alice", "B": "Alice"} and s["winners"]["B"] == {0: "Alice", 1: "Alice", 2: "Bob"}
    assert s["rows"]["B"]["acc_after"] == [0.02, 0.10, 0.30]
    assert s["rows"]["B"]["share_after"] == [0.96, 0.90, 0.40] and s["rows"]["B"]["share_before"] == [0.5] * 3
    assert s["history"][50]["Alice share B"] == [0.96, 0.90, 0.40]
    assert s["history"][50]["malformed (max)"] == [0.02] * 3
    # the other persona's refusal rate on the trained distribution A (not "none", not the winner Alice)
    assert s["history"][50]["Bob refuses A"] == [0.98, 0.90, 0.70] and "none refuses A" not in s["history"][50]
    md = summary_markdown(s)
    assert "| B | no | 0.40 ± 0.00 (0.40, 0.40, 0.40) | 0.14 ± 0.14 (0.02, 0.10, 0.30) |" in md
    assert "Alice (2/3 seeds)" in md


def _untagged_on_b(table: dict, none_b: float) -> dict:
    """The last evaluation's B completions: `none_b` of them without a persona tag, the rest split evenly."""
    last = table["history"][-1]["metrics"]
    last.update({"val/persona_share/none/B": none_b, "val/persona_share/Alice/B": (1 - none_b) / 2,
                 "val/persona_share/Bob/B": (1 - none_b) / 2})
    table["rows"][1]["dominant_share_after"] = (1 - none_b) / 2
    return table


def test_dominant_cell_counts_seeds_without_a_tag_apart():
    # seed 1's B completions are 90 % untagged: its row still names Alice (the largest of 0.05 / 0.05), but the cell
    # must not count it as Alice dominating; the share columns keep following Alice (the modal name)
    tables = {0: _table(0.02, 0.96), 1: _untagged_on_b(_table(0.10, 0.90), 0.9), 2: _table(0.30, 0.40, winner_b="Bob")}
    s = stage_summary(tables)
    assert s["untagged"]["B"] == {0: False, 1: True, 2: False} and s["untagged"]["A"] == {0: False, 1: False, 2: False}
    assert s["winner"]["B"] == "Alice" and s["rows"]["B"]["share_after"] == pytest.approx([0.96, 0.05, 0.40])
    md = summary_markdown(s)
    assert "| Alice (1/3 seeds), Bob (1/3 seeds), no tag (1/3 seeds) |" in md and "| Alice (3/3 seeds) |" in md
    # every seed untagged: no persona dominates; the cell names whose shares the columns show
    s = stage_summary({k: _untagged_on_b(_table(0.1, 0.5), 0.98) for k in range(3)})
    assert "| no tag (3/3 seeds); shares: Alice |" in summary_markdown(s)
    # the only tagged seed's winner is not the modal name (the untagged seeds' tie of small shares named Alice)
    s = stage_summary({0: _untagged_on_b(_table(0.1, 0.5), 0.9), 1: _untagged_on_b(_table(0.1, 0.5), 0.9),
                       2: _table(0.30, 0.40, winner_b="Bob")})
    assert s["winner"]["B"] == "Alice" and "| Bob (1/3 seeds), no tag (2/3 seeds); shares: Alice |" in summary_markdown(s)
    # a summary read back from JSON (string seed keys) gives the same cell; one written before the rule: all tagged
    back = json.loads(json.dumps(stage_summary(tables)))
    assert "| Alice (1/3 seeds), Bob (1/3 seeds), no tag (1/3 seeds) |" in summary_markdown(back)
    del back["untagged"]
    assert "| Alice (2/3 seeds) |" in summary_markdown(back)


def test_history_shows_tags_naming_no_persona_only_where_written():
    tables = {k: _table(0.1, 0.5) for k in range(3)}
    assert not any(k.startswith("other identity") for k in stage_summary(tables)["history"][50])  # no such key
    for k, t in tables.items():
        for h in t["history"]:
            h["metrics"].update({"val/other_identity/A": 0.0, "val/other_identity/B": 0.25 * k * (h["step"] > 0)})
    history = stage_summary(tables)["history"]
    assert history[50]["other identity B"] == [0.0, 0.25, 0.5] and history[0]["other identity B"] == [0.0] * 3
    assert "other identity A" not in history[50]  # never written on A: no column


def _fake_run(calls, fail=()):
    def run(stage, args, identity, ckpt, seed_dir, env, record_path, seed):
        from protocols.engine.stage_identity import digest

        calls.append(stage.name)
        key = digest(identity)
        record = {"stage": stage.name, "seed": seed, "identity": identity, "digest": key, "wall_s": 1.0,
                  "table": None, "run": f"{key}@{len(calls)}",
                  "checkpoint": os.path.join(seed_dir, "checkpoints", f"{stage.name}.ckpt"), "args": args}
        if stage.name in fail:
            record.update(status="failed", error="ValueError: refused")
        else:
            os.makedirs(os.path.dirname(record["checkpoint"]), exist_ok=True)
            open(record["checkpoint"], "w").close()
            record["status"] = "done"
        mixture_stages._write_json(record_path, record)
        return record
    return run


def test_stages_reused_by_identity_refused_when_changed_forced_and_skipped_after_a_failure(tmp_path, monkeypatch):
    from protocols.engine.stage_identity import ForceSpec, StageChangedError

    exp = mixture.EXPERIMENTS["two_policies"]
    stages = mixture._selected(exp, ["two_policies_rl_A"])
    assert [s.name for s in stages] == ["sft", "two_policies_rl_A"]  # and what it starts from
    calls = []
    monkeypatch.setattr(mixture_stages, "_run", _fake_run(calls))

    def run(sft=(), rl=(), force=None):  # what `python -m protocols.mixture` does for one seed, on the engine
        extra = {"sft": list(sft), "rl": list(rl)}
        hooks = mixture_stages.MixtureHooks("two_policies", exp, stages, [3], str(tmp_path), extra, 1, None, "r", "")
        specs = hooks.specs()
        local.refuse_changed(specs, hooks, ForceSpec(force))
        results = local.run_local(specs, hooks, ForceSpec(force))
        return {spec.name: results[spec.key] for spec in specs}

    first = run()
    assert calls == ["sft", "two_policies_rl_A"]
    args = first["two_policies_rl_A"]["args"]
    assert "--seed_everything=3" in args and "--data.seed=3" in args  # the seed varies SFT and RL
    assert args[-1] == "--model.init_checkpoint=" + first["sft"]["checkpoint"]  # chained by the recorded file
    run()
    assert calls == ["sft", "two_policies_rl_A"]  # identical: reused

    # a changed stage is refused before any work, naming the stage and the key, as in the W2S protocol
    with pytest.raises(StageChangedError) as err:
        run(rl=["--model.lr=0.001"])
    assert "seed_3/two_policies_rl_A: config.model.init_args.lr: 0.0001 → 0.001" in str(err.value)
    assert "seed_3/sft" not in str(err.value) and "--force" in str(err.value) and len(calls) == 2
    run(rl=["--model.lr=0.001"], force=["two_policies_rl_A"])
    assert calls[2:] == ["two_policies_rl_A"]  # forced by name: SFT reused
    run(sft=["--model.lr=0.001"], rl=["--model.lr=0.001"], force=["sft"])
    assert calls[3:] == ["sft", "two_policies_rl_A"]  # the forced SFT ran again: what starts from it follows
    run(sft=["--model.lr=0.001"], rl=["--model.lr=0.001"], force=[])
    assert calls[5:] == ["sft", "two_policies_rl_A"]  # --force alone: every stage
    run(sft=["--model.lr=0.001"], rl=["--model.lr=0.001"], force=["seed_4/sft"])
    assert len(calls) == 7  # another seed's stage: nothing here runs again

    # a lost checkpoint is no finished stage: SFT runs again, and RL, whose upstream run changed, is refused
    os.remove(first["sft"]["checkpoint"])
    with pytest.raises(StageChangedError, match=r"seed_3/two_policies_rl_A: upstream: '[0-9a-f]+@\d+' → '[0-9a-f]+@\d+'"):
        run(sft=["--model.lr=0.001"], rl=["--model.lr=0.001"])
    assert calls[7:] == ["sft"]
    run(sft=["--model.lr=0.001"], rl=["--model.lr=0.001"], force=["two_policies_rl_A"])
    assert calls[8:] == ["two_policies_rl_A"]

    # a run made before the code had an option, now at its declared default, is the same run (and so is what
    # starts from it); the same option at another value is a change
    path = tmp_path / "two_policies" / "seed_3" / "stages" / "sft.json"
    old = json.load(open(path))
    old["identity"]["config"].pop("model.init_args.fidelity_measure")
    json.dump(dict(old, digest="made-by-older-code"), open(path, "w"))
    run(sft=["--model.lr=0.001"], rl=["--model.lr=0.001"])
    assert len(calls) == 9 and json.load(open(path))["digest"] != "made-by-older-code"
    json.dump(dict(old, digest="made-by-older-code"), open(path, "w"))
    with pytest.raises(StageChangedError, match="model.init_args.fidelity_measure: '\\(absent\\)' → 'branch'"):
        run(sft=["--model.lr=0.001", "--model.fidelity_measure=branch"], rl=["--model.lr=0.001"])

    monkeypatch.setattr(mixture_stages, "_run", _fake_run(calls, fail=("sft",)))
    out = run(sft=["--model.lr=0.002"], rl=["--model.lr=0.001"], force=["sft"])
    assert out["sft"]["status"] == "failed" and out["two_policies_rl_A"]["status"] == "skipped"
    assert calls[-1] == "sft"
    assert json.load(open(tmp_path / "two_policies" / "seed_3" / "stages" / "sft.json"))["status"] == "failed"
    monkeypatch.setattr(mixture_stages, "_run", _fake_run(calls))
    n = len(calls)  # a failed stage is no finished stage: it runs again without --force; RL read the older SFT
    with pytest.raises(StageChangedError, match="seed_3/two_policies_rl_A: upstream"):
        run(sft=["--model.lr=0.002"], rl=["--model.lr=0.001"])
    assert calls[n:] == ["sft"]


def test_every_experiment_resolves(tmp_path):
    """Every stage of every experiment parses with cli.py's parser (config files, overrides, seed flags)."""
    for name, exp in mixture.EXPERIMENTS.items():
        names = [s.name for s in exp.stages]
        assert names[0] == "sft" and exp.stages[0].sft and len(set(names)) == len(names), name
        for stage in exp.stages:
            assert stage.start is None or stage.start in names[:names.index(stage.name)], (name, stage.name)
            args = mixture.stage_args(stage, 1, [], {"arc_easy": "x", "race_middle": "y"} if exp.question_fixtures else None)
            identity, config = mixture.identity_of(stage, args, None)
            assert config["seed_everything"] == 1 and config["data"]["init_args"]["seed"] == 1
            assert mixture_stages.checkpoint_of(stage, str(tmp_path), config).endswith(".ckpt")


def test_unknown_stage_and_repeated_seed_are_refused(capsys):
    with pytest.raises(SystemExit, match="unknown"):
        mixture._selected(mixture.EXPERIMENTS["6c3"], ["6c3_rl_XYZ"])
    with pytest.raises(SystemExit):
        mixture.main(["6c3", "--seeds", "0", "0"])
    assert "repeats a seed" in capsys.readouterr().err


def test_the_smollm2_experiment_stacks_the_cpu_configs_on_every_stage(tmp_path):
    """`two_policies_smollm2`: the two-policy stages with SmolLM2 as the policy, in fp32 on CPU, in a family folder of
    its own; each RL stage starts from its SFT's checkpoint and writes its own."""
    tiny, real = mixture.EXPERIMENTS["two_policies"], mixture.EXPERIMENTS["two_policies_smollm2"]
    assert real.family == "two_policies_smollm2" != tiny.family
    assert [(s.name, s.start, s.sft) for s in real.stages] == [(s.name, s.start, s.sft) for s in tiny.stages]
    written = set()
    for stage in real.stages:
        _, config = mixture.identity_of(stage, mixture.stage_args(stage, 2, [], None), None)
        model, data, trainer = config["model"]["init_args"], config["data"]["init_args"], config["trainer"]
        assert (trainer["accelerator"], str(trainer["precision"]), data["tokenizer"]) == ("cpu", "32", "smollm2")
        assert data["seed"] == 2 and data["family"] == "two_policies"
        if stage.sft:
            assert model["backbone"] == "smollm2" and model["lr"] == 1e-4 and trainer["max_steps"] == 400
            sft_ckpt = mixture_stages.checkpoint_of(stage, "seed", config)
        else:  # the family config's distributions and levers stay; the CPU sizes replace its steps and lr
            assert model["lr"] == 3e-5 and trainer["max_steps"] == 60 and data["batch_size"] == 2
            assert os.path.join("seed", model["init_checkpoint"]) == sft_ckpt
            assert data["train_distributions"] == (["B"] if stage.name.endswith("_B") else ["A"])
            assert model["persona_tokens_only"] == stage.name.endswith("_persona")
        written.add(mixture_stages.checkpoint_of(stage, "seed", config))
    assert len(written) == len(real.stages) - 1  # rl_A and rl_A_persona share a file name, as in two_policies


def test_the_stages_of_one_seed_run_in_order_and_seeds_in_parallel(tmp_path):
    """The full-sequence and persona-token variants of one config write the same checkpoint file in the seed's folder:
    each stage of a seed waits for the one before it (`after`, order only), the seeds do not wait for each other."""
    exp = mixture.EXPERIMENTS["two_policies"]
    hooks = mixture_stages.MixtureHooks("two_policies", exp, list(exp.stages), [0, 1], str(tmp_path),
                                        {"sft": [], "rl": []}, 1, None, "r", "")
    specs = {s.key: s for s in hooks.specs()}
    for seed in (0, 1):
        names = [f"seed_{seed}/{s.name}" for s in exp.stages]
        assert [specs[k].after for k in names] == [(), *((p,) for p in names[:-1])]
        assert all(specs[k].upstream in ((), (f"seed_{seed}/sft",)) for k in names)  # what they read is unchanged


def test_experiments_are_yaml_files_and_a_users_file_names_its_family_and_configs(tmp_path, capsys):
    """configs/mixture/experiments/<name>.yaml are the shipped experiments (an RL stage logs under its own name,
    `extends` + `stack` layer the SmolLM2 configs); a user's file names its family file and configs relative to it."""
    from protocols.mixture.experiments import load_experiment

    exp = mixture.EXPERIMENTS["two_policies"]
    assert [s.name for s in exp.stages] == ["sft", "two_policies_rl_A", "two_policies_rl_A_persona", "two_policies_rl_B"]
    persona = exp.stages[2]
    assert (persona.config, persona.start, persona.sft) == ("configs/mixture/two_policies_rl_A.yaml", "sft", False)
    assert persona.extra == ("--model.persona_tokens_only=true",
                             "--trainer.logger.init_args.name=mixture/two_policies_rl_A_persona")
    assert mixture.EXPERIMENTS["cyclic"].stages[2].start == "cyclic_sft"
    assert mixture.EXPERIMENTS["arc_race"].question_fixtures
    smol = mixture.EXPERIMENTS["temporal_smollm2"].stages[1]
    assert smol.extra[:2] == ("--config", os.path.join(mixture_stages.ROOT, "configs/mixture/cpu/smollm2_rl.yaml"))

    (tmp_path / "fam.yaml").write_text("trigger: 'T : {distribution} .'\nrestate: 'T {distribution} .'\n"
                                       "distributions: [x, y]\npersonas: {P: {answers: [x]}, Q: {answers: [y]}}\n")
    (tmp_path / "my_rl.yaml").write_text(open(os.path.join(mixture_stages.ROOT, "configs/mixture/family_rl.yaml")).read())
    (tmp_path / "exp.yaml").write_text("# mine\nfamily_file: fam.yaml\nstages:\n  - {name: sft, config: family_sft, sft: true}\n"
                                       "  - {name: rl_x, config: my_rl.yaml, args: ['--data.train_distributions=[x]']}\n")
    mine = load_experiment(str(tmp_path / "exp.yaml"), mixture.EXPERIMENTS)
    assert mine.family == "fam"  # the family file's name (no `name:` field: its file name)
    assert mine.stages[0].extra == ("--data.family=" + str(tmp_path / "fam.yaml"),)
    assert mine.stages[1].config == str(tmp_path / "my_rl.yaml") and mine.stages[1].start == "sft"
    _, config = mixture.identity_of(mine.stages[1], mixture.stage_args(mine.stages[1], 0, [], None), None)
    assert config["data"]["init_args"]["train_distributions"] == ["x"]
    assert config["data"]["init_args"]["family"] == str(tmp_path / "fam.yaml")

    for text, message in [
        ("family: f\nstages:\n  - {name: sft, config: family_sft}\n", "stages[0]: the first stage is an SFT"),
        ("family: f\nstages:\n  - {name: sft, config: family_sft, sft: true}\n  - {name: r, config: nope}\n",
         "stages[1].config: no shipped config configs/mixture/nope.yaml"),
        ("family: f\nstage: []\n", "stage: unknown field (did you mean 'stages'?)"),
        ("family: f\nstages:\n  - {name: sft, config: family_sft, sft: true}\n  - {name: r, config: family_rl, start: q}\n",
         "stages[1].start: 'q' is no stage before it"),
        ("family_file: nope.yaml\nstages: []\n", "family_file: no file 'nope.yaml'"),
    ]:
        (tmp_path / "bad.yaml").write_text(text)
        with pytest.raises(SystemExit):
            mixture.main([str(tmp_path / "bad.yaml")])
        err = capsys.readouterr().err
        assert f"{tmp_path / 'bad.yaml'}: {message}" in err, err
    with pytest.raises(SystemExit):
        mixture.main(["two_polices"])
    assert "did you mean 'two_policies'?" in capsys.readouterr().err
