"""CompletionSamples: the written completions are the evaluated ones, parsed as the metrics parsed them, and keeping
them changes no metric."""
import json

import lightning as L
import pytest

from callbacks.completion_samples import CompletionSamples
from callbacks.persona_tracking import PersonaTrackingCallback
from lightning_modules.policy.rewards import behavioural_persona, parse_completion, read_persona, tolerant_persona
from lightning_modules.policy.rl import PolicyRLModule
from tests.test_policy_modules import _rl_dm, _sft_ckpt, _trainer


def _fit(tmp_path, cache_dir, ckpt, callbacks):
    L.seed_everything(3)
    m = PolicyRLModule(init_checkpoint=ckpt, group_size=4, lr=1e-2, max_new_tokens=6, eval_temperature=1.0)
    track = PersonaTrackingCallback(output_dir=str(tmp_path / "track"), theory_overlay=False)
    t = _trainer(2, val_check_interval=2, check_val_every_n_epoch=None, limit_val_batches=1.0,
                 num_sanity_val_steps=-1, callbacks=[track, *callbacks])
    t.fit(m, _rl_dm(cache_dir))
    return m, track


def test_samples_are_the_evaluated_completions_and_change_nothing(tmp_path, cache_dir):
    ckpt = _sft_ckpt(tmp_path, cache_dir, fidelity=0.99)
    samples = CompletionSamples(per_distribution=2, dirpath=str(tmp_path / "samples"))
    m, with_samples = _fit(tmp_path, cache_dir, ckpt, [samples])
    _, without = _fit(tmp_path, cache_dir, ckpt, [])
    # the same draws and the same counts with and without the callback
    assert json.dumps([h["metrics"] for h in with_samples.history]) == json.dumps([h["metrics"] for h in without.history])

    rows = [json.loads(line) for line in (tmp_path / "samples" / "completion_samples.jsonl").read_text().splitlines()]
    # two evaluations (the sanity pass = step 0, then step 2) x 2 distributions x 2 kept completions
    assert [(r["step"], r["distribution"]) for r in rows] == [(s, d) for s in (0, 2) for d in ("A", "B") for _ in range(2)]
    for r in rows:
        parsed = parse_completion(r["completion"], m.family.personas)
        assert r["parsed_persona"] == parsed.persona and r["identity_tag"] == parsed.identity
        assert r["refused"] == parsed.refused
        assert r["malformed"] == parsed.malformed and r["prompt"] and r["gold"] is not None
        correct = parsed.answer is not None and parsed.answer.lower() == r["gold"].replace(" ", "").lower()
        tolerant = tolerant_persona(r["completion"], m.family.personas)
        assert r["behaviour_persona"] == behavioural_persona(parsed, correct, False, m.family, r["distribution"],
                                                             tolerant)
        assert r["read_persona"] == read_persona(tolerant, r["behaviour_persona"], parsed.identity)


def test_bad_size_is_refused():
    with pytest.raises(ValueError, match="per_distribution=0"):
        CompletionSamples(per_distribution=0)
