"""TensorBoard's HPARAMS tab for the W2S protocol: one session per stage with its method, objective, λ, layers and
seed and its final scores, read back from the event files as TensorBoard's hparams plugin reads them; equal to
results.json; rebuilt, never appended, on a rerun; the stages' Lightning runs add no session of their own."""
import glob
import json
import math
import os

import pytest

from protocols.w2s.hparams import stage_hparams, stage_metrics
from protocols.w2s.protocol import main as run_protocol
from tests.test_w2s_protocol import SRC, TARGETS, _tiny_protocol, _write

HPARAM_NAMES = {"method", "objective", "objective_args", "anchor_coef", "anchor_layers", "seed"}


def test_stage_hparams_from_the_resolved_config():
    config = {"model": {"init_args": {"anchor_coef": 100.0, "anchor_layers": [0.5, 0.75],
                                      "objective": {"class_path": "lightning_modules.reward.objectives.ConfidenceW2S",
                                                    "init_args": {"aux_coef": 0.5}}}}}
    assert stage_hparams("anchor_mid", 2, config) == {
        "method": "anchor_mid", "objective": "ConfidenceW2S", "objective_args": '{"aux_coef": 0.5}',
        "anchor_coef": 100.0, "anchor_layers": "0.5,0.75", "seed": 2}
    teacher = {"model": {"init_args": {"anchor_coef": 0.0, "anchor_layers": [1.0], "objective": None}}}
    assert stage_hparams("teacher", 0, teacher) == {
        "method": "teacher", "objective": "GoldBradleyTerry", "objective_args": "{}", "anchor_coef": 0.0,
        "anchor_layers": "none", "seed": 0}
    outside = stage_hparams("teacher", 1, teacher, pretrained="hf_classifier:/m/rm")
    assert outside["objective"] == "outside:hf_classifier:/m/rm"  # not trained here: no default objective shown


def test_stage_metrics_are_the_results_table_values():
    student = {"test": {
        "src": {"acc": 0.8, "pairs": 10}, "rewardbench": {"acc": 0.5, "pairs": 4, "sections": {"Chat Hard": 0.25}},
        "transfer": {"acc_student": {"src": 80.0, "rewardbench": 50.0}, "acc_teacher": {"src": 70.0, "rewardbench": 60.0},
                     "wrg": 10.0, "aog": {"rewardbench": -10.0}, "aog_mean": -10.0, "nts": -10.0, "pgr": 0.5}}}
    assert stage_metrics(student, "src", is_teacher=False) == {
        "w2s/acc/src": 80.0, "w2s/acc/rewardbench": 50.0, "w2s/wrg": 10.0, "w2s/aog/rewardbench": -10.0,
        "w2s/aog_mean": -10.0, "w2s/nts": -10.0, "w2s/pgr": 0.5, "w2s/section/rewardbench/chat_hard": 25.0}
    teacher = {"test": {"src": {"acc": 0.7, "pairs": 10}, "rewardbench": {"acc": 0.6, "pairs": 4}}}
    assert stage_metrics(teacher, "src", is_teacher=True) == {
        "w2s/acc/src": 70.0, "w2s/acc/rewardbench": 60.0, "w2s/wrg": 0.0, "w2s/aog/rewardbench": 0.0,
        "w2s/aog_mean": 0.0, "w2s/nts": 0.0}


def _read_sessions(logdir: str) -> dict[str, tuple[dict, dict]]:
    """run -> (hyperparameters, {metric tag: value}) for every run holding an HPARAMS session start."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    sessions = {}
    for events in glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True):
        run_dir = os.path.dirname(events)
        acc = EventAccumulator(run_dir, size_guidance={"tensors": 0, "scalars": 0})
        acc.Reload()
        try:
            content = acc.PluginTagToContent(metadata.PLUGIN_NAME)
        except KeyError:  # a run without any HPARAMS data
            continue
        if metadata.SESSION_START_INFO_TAG not in content:
            continue
        start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
        hparams = {k: (v.string_value if v.HasField("string_value") else v.number_value)
                   for k, v in start.hparams.items()}
        values = {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
        assert all(len(v) == 1 for v in values.values()), values  # one final value per metric, never appended
        sessions[os.path.relpath(run_dir, logdir)] = (hparams, {t: v[0] for t, v in values.items()})
    return sessions


def _experiment_columns(logdir: str) -> tuple[set, set]:
    """The hparam and metric columns the HPARAMS tab shows for `tensorboard --logdir <logdir>`."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import backend_context

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
    ctx, hp = context.RequestContext(), backend_context.Context(base_plugin.TBContext(logdir=logdir,
                                                                                     data_provider=provider))
    experiment = hp.experiment_from_metadata(ctx, "", True, hp.hparams_metadata(ctx, ""),
                                             hp.hparams_from_data_provider(ctx, "", limit=None))
    return {h.name for h in experiment.hparam_infos}, {m.name.tag for m in experiment.metric_infos}


def test_protocol_stages_in_the_hparams_tab(tmp_path, word_tokenizer_dir, cache_dir):
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, ceiling=True,
                         methods=[{"name": "anchor", "objective": "naive", "anchor_coef": 1.0}])
    results = run_protocol(["--config", _write(tmp_path, cfg)])
    out = cfg["out_dir"]

    sessions = _read_sessions(out)
    assert sorted(sessions) == ["results/hparams/seed0/anchor", "results/hparams/seed0/ceiling",
                                "results/hparams/seed0/teacher"]  # the stages' own Lightning runs hold none
    hp = {run.split("/")[-1]: h for run, (h, _) in sessions.items()}
    assert hp["anchor"] == {"method": "anchor", "objective": "SoftBradleyTerry",
                            "objective_args": '{"label_smoothing": 0.0, "label_temperature": 1.0}',
                            "anchor_coef": 1.0, "anchor_layers": "1", "seed": 0.0}
    assert (hp["ceiling"]["anchor_coef"], hp["ceiling"]["anchor_layers"]) == (0.0, "none")
    assert hp["ceiling"]["objective"] == hp["teacher"]["objective"] == "GoldBradleyTerry"

    expected_tags = {f"w2s/acc/{s}" for s in [SRC, *TARGETS]} | {f"w2s/aog/{t}" for t in TARGETS} | {
        "w2s/wrg", "w2s/aog_mean", "w2s/nts"}
    for run, (h, values) in sessions.items():
        row = results["rows"][h["method"]]
        has_pgr = h["method"] not in ("teacher", "ceiling")
        assert set(values) == expected_tags | ({"w2s/pgr"} if has_pgr else set()), run
        for tag, value in values.items():  # the results table's cell (one seed: the mean is the value)
            cell = row[tag[len("w2s/"):]]["mean"]
            assert value == pytest.approx(cell, abs=1e-4) or (math.isnan(cell) and math.isnan(value)), (run, tag)
    assert sessions["results/hparams/seed0/teacher"][1]["w2s/nts"] == 0.0

    columns, metrics = _experiment_columns(out)
    assert columns == HPARAM_NAMES
    assert metrics == expected_tags | {"w2s/pgr"}

    # A rerun reuses every stage: the folder is rebuilt, each session still once. A stage recorded before
    # default_hp_metric became a location key (its identity holds the old value) is reused, not refused.
    result_path = os.path.join(out, "seed0", "anchor", "result.json")
    with open(result_path) as f:
        finished = json.load(f)
    finished["identity"]["config"]["trainer.logger.init_args.default_hp_metric"] = True
    with open(result_path, "w") as f:
        json.dump(finished, f)
    run_protocol(["--config", _write(tmp_path, cfg)])
    assert _read_sessions(out).keys() == sessions.keys()
    assert [len(glob.glob(os.path.join(out, r, "events.*"))) for r in sessions] == [1] * 3
