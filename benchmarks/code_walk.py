"""How far a reader walks through `protocols/` to follow a W2S run (issue 51's measure): a tiny W2S protocol (a
1-layer model on a word tokenizer; seed 0; naive, a 2-value ANCHOR sweep and the gold ceiling) runs in this
process under `sys.setprofile`, which records every call into a file of `protocols/`. The walk is that sequence of
files with repeats in a row merged:

- stays: its length; rooms: the distinct files; returns: stays in a file already visited and left before;
- per stage (the engine's `local._one`, from the decision to run or reuse to the stage's result): the files of
  `protocols/` it crosses, and how often it enters the protocol's command file (`protocols/w2s.py` before the
  three wings, `protocols/w2s/protocol.py` after).

The run's fits cross cli.py and the models as well; those are not counted (the walk is the protocol layer's).

    python benchmarks/code_walk.py [--root REPO]   # REPO: another checkout (e.g. a git worktree of an older commit)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help="the checkout to walk (default: this one)")
    root = os.path.abspath(parser.parse_args().root)
    sys.path.insert(0, root)
    os.chdir(root)
    with tempfile.TemporaryDirectory() as tmp:
        config = _tiny_config(root, tmp)
        calls = _traced(root, lambda: _protocol_main()(["--config", config]))
    print(json.dumps(summary(calls), indent=2))


def _tiny_config(root: str, tmp: str) -> str:
    import yaml

    from datamodules.preference.synthetic_shift import synthetic_vocabulary
    from datamodules.tokenizers import build_wordlevel_tokenizer

    tokenizer = os.path.join(tmp, "tokenizer")
    build_wordlevel_tokenizer(set(synthetic_vocabulary()) | {"[PAD]", "[UNK]"}).save_pretrained(tokenizer)
    sizes = {n: {"n_train": 160, "n_validation": 24, "n_test": 33} for n in
             ("synth_helpful_cooking", "synth_helpful_science", "synth_helpful_travel", "synth_helpful_tech")}
    common = [f"--model.tokenizer={tokenizer}", f"--data.source_options={json.dumps(sizes)}",
              f"--data.cache_dir={os.path.join(tmp, 'cache')}", "--trainer.max_epochs=1", "--data.max_length=96"]
    tiny = os.path.join(root, "configs/model/tiny_teacher.yaml")
    cfg = {"out_dir": os.path.join(tmp, "run"), "trainer_configs": [os.path.join(root, "configs/trainer/cpu.yaml")],
           "data_configs": [os.path.join(root, "configs/data/synth_helpful.yaml")],
           "teacher_configs": [tiny], "student_configs": [tiny], "teacher_args": common, "student_args": common,
           "seeds": [0], "ceiling": True, "drift": False,
           "methods": [{"name": "naive", "objective": "naive"},
                       {"name": "anchor", "args": ["--reference.cache_outputs=true"],
                        "sweep": {"--model.anchor_coef": [10.0, 100.0]}}]}
    path = os.path.join(tmp, "protocol.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def _protocol_main():
    try:  # the three wings (issue 51)
        from protocols.w2s.protocol import main
    except ImportError:  # before: protocols/w2s.py
        from protocols.w2s import main
    return main


def _traced(root: str, run) -> list[tuple[str, str]]:
    """(event, file relative to root) for every call into protocols/, and the start / end of each `local._one`."""
    protocols = os.path.join(root, "protocols") + os.sep
    calls: list[tuple[str, str]] = []
    depth = {"one": 0}

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        path = frame.f_code.co_filename
        if not path.startswith(protocols):
            return
        rel = os.path.relpath(path, root)
        if frame.f_code.co_name == "_one" and rel == os.path.join("protocols", "engine", "local.py"):
            calls.append(("stage_start" if event == "call" else "stage_end", rel))
        elif event == "call":
            calls.append(("call", rel))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def _walk(files: list[str]) -> tuple[list[str], int]:
    """The files with repeats in a row merged, and how many of them return to a file left before."""
    stays = [f for i, f in enumerate(files) if i == 0 or files[i - 1] != f]
    seen, returns = set(), 0
    for f in stays:
        returns += f in seen
        seen.add(f)
    return stays, returns


def summary(calls: list[tuple[str, str]]) -> dict:
    everything = [f for event, f in calls if event in ("call", "stage_start")]
    stays, returns = _walk(everything)
    command_files = {os.path.join("protocols", "w2s.py"), os.path.join("protocols", "w2s", "protocol.py")}
    stages, current = [], None
    for event, f in calls:
        if event == "stage_start":
            current = [f]
        elif event == "stage_end" and current is not None:
            stage_stays, stage_returns = _walk(current)
            stages.append({"files": sorted(set(current)), "files_crossed": len(set(current)),
                           "stays": len(stage_stays), "returns": stage_returns,
                           "command_file_entries": sum(1 for s in stage_stays if s in command_files)})
            current = None
        elif current is not None:
            current.append(f)
    return {"walk": {"stays": len(stays), "rooms": len(set(stays)), "returns": returns,
                     "command_file_entries": sum(1 for s in stays if s in command_files)},
            "stages": len(stages),
            "per_stage_max": {k: max((s[k] for s in stages), default=0)
                              for k in ("files_crossed", "stays", "returns", "command_file_entries")},
            "per_stage_mean": {k: round(sum(s[k] for s in stages) / max(len(stages), 1), 1)
                               for k in ("files_crossed", "stays", "returns", "command_file_entries")},
            "widest_stage_files": max(stages, key=lambda s: s["files_crossed"])["files"] if stages else []}


if __name__ == "__main__":
    main()
