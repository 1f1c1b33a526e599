"""`protocols.w2s.grid`: the paper grid parses into its 12 protocols and 216 stages, the GPU-hour estimate follows its
FLOP formula (hand values), and one command runs every protocol of a grid."""
import json
import os

import pytest
import yaml

from protocols.w2s import grid as grid_mod
from tests.test_w2s_protocol import _tiny_protocol, _write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER = os.path.join(ROOT, "configs", "experiment", "paper", "grid.yaml")


def _grid(path=PAPER, **over) -> grid_mod.Grid:
    raw = {**yaml.safe_load(open(path)), **over}
    return grid_mod.Grid(**{**raw, "slurm": grid_mod.SlurmOptions(**raw.get("slurm", {}))})


def test_paper_grid_lists_every_source_and_family_and_estimates_by_flops(monkeypatch):
    monkeypatch.chdir(ROOT)
    g = _grid()
    assert len(g.protocols) == 12 and all(os.path.isfile(p) for p in g.protocols)
    rows = grid_mod.estimate(g)
    assert len(rows) == 12 * 3 * 6  # seeds x (teacher, ceiling, 4 methods)
    row = next(r for r in rows if r["protocol"] == "runs/paper/llama_rail" and r["stage"] == "seed0/teacher")
    n, seq, half, test = 1.24e9, 1024, 4_000, 1_000 + 2_300 + 8_200  # rail: 8k train pairs; its OOD: hh_harmless, PKU
    flops = half * seq * 6 * n + test * seq * 2 * n + half * seq * 2 * n  # fit, test, label the student half
    assert row["flops"] == pytest.approx(flops) and row["gpu_hours"] == pytest.approx(flops / 400e12 / 3600)
    anchor = next(r for r in rows if r["protocol"] == "runs/paper/qwen_rail" and r["stage"] == "seed1/anchor")
    n = 7.6e9  # LoRA: 4N per trained token, + 2N for the reference forward
    assert anchor["flops"] == pytest.approx(half * seq * 6 * n + test * seq * 2 * n)
    flags = grid_mod.protocol_args(g, g.protocols[0])
    assert flags[:4] == ["--config", g.protocols[0], "--launcher", "slurm"]
    assert "--slurm.gpus_per_node=1" in flags and "--slurm.extra=[]" in flags


@pytest.mark.slow  # a whole protocol run (15-25 s): make test-slow; the fast suite keeps its parts' unit tests
def test_one_command_runs_every_protocol_of_a_grid(tmp_path, word_tokenizer_dir, cache_dir, capsys):
    configs = []
    for name in ("a", "b"):
        cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, out_dir=str(tmp_path / name))
        configs.append(_write(tmp_path, cfg, f"{name}.yaml"))
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text(yaml.safe_dump({"protocols": configs, "launcher": "local"}))
    grid_mod.main(["--config", str(grid_file)])
    for name in ("a", "b"):
        assert list(json.load(open(tmp_path / name / "results.json"))["rows"]) == ["teacher", "naive"]
    capsys.readouterr()
    grid_mod.main(["--config", str(grid_file), "--status"])
    printed = capsys.readouterr().out
    assert printed.strip().endswith("grid: 6 done")  # 2 protocols x (teacher, naive, table)
    # each table says whose it is: the config, then its out_dir, before that protocol's rows
    heads = [printed.index(f"## {configs[i]} (out_dir {tmp_path / name})") for i, name in enumerate("ab")]
    tables = [i for i in range(len(printed)) if printed.startswith("| stage | state |", i)]
    assert len(tables) == 2 and heads[0] < tables[0] < heads[1] < tables[1]
