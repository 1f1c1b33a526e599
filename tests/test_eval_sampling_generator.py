"""Evaluation never moves the RL trajectory: changing the validation cadence leaves the trained weights bit-identical,
and an evaluation batch's draws depend on the seed, the step and its prompts alone (issue 24, item 8)."""
import lightning as L
import pytest
import torch

from datamodules.triggers.datamodule import TriggerDataModule
from lightning_modules.policy.base import evaluation_seed
from lightning_modules.policy.rl import PolicyRLModule

TINY = dict(n_layer=1, n_embd=32, n_head=2, max_positions=64)
STEPS = 6  # 4 steps per epoch (8 prompts, batch 2): the run crosses an epoch boundary (a fresh shuffled loader)


def _run(cache_dir: str, sampler: str, every) -> tuple[dict, dict, dict]:
    """A tiny GRPO run of STEPS steps from a fresh model, validating every `every` steps (None: never).

    Returns the start and final state dicts and the evaluation completions by global step.
    """
    L.seed_everything(7)
    m = PolicyRLModule(**TINY, min_sft_fidelity=0, group_size=2, lr=1e-2, max_new_tokens=4, sampler=sampler,
                       eval_temperature=1.0)
    score, evals = m.score, {}

    def rigged_score(completions, records):  # a fresh model earns no reward: the first of each group gets 1
        out = score(completions, records)
        out["reward"] = (torch.arange(len(records)) % m.hparams.group_size == 0).float()
        if not m.training:  # an evaluation batch (Lightning puts the module in eval mode for validation)
            evals.setdefault(int(m.global_step), []).append(completions.clone())
        return out

    m.score = rigged_score
    start = {}

    class KeepStart(L.Callback):
        def on_train_start(self, trainer, pl_module):
            start.update({k: v.detach().clone() for k, v in pl_module.state_dict().items()})

    dm = TriggerDataModule(family="two_policies", mode="rl", train_distributions=["A"], num_train=8, batch_size=2,
                           num_val_per_distribution=3, val_batch_size=4, cache_dir=cache_dir)
    cadence = (dict(limit_val_batches=0) if every is None
               else dict(val_check_interval=every, check_val_every_n_epoch=None, limit_val_batches=1.0))
    t = L.Trainer(max_steps=STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, accelerator="cpu", devices=1, num_sanity_val_steps=0,
                  callbacks=[KeepStart()], **cadence)
    t.fit(m, dm)
    return start, {k: v.detach().clone() for k, v in m.state_dict().items()}, evals


@pytest.mark.parametrize("sampler", ["static", "kv_loop"])
def test_evaluation_cadence_leaves_rl_weights_bit_identical(cache_dir, sampler):
    start, never, evals_none = _run(cache_dir, sampler, every=None)
    _, every_step, evals_1 = _run(cache_dir, sampler, every=1)
    _, every_third, evals_3 = _run(cache_dir, sampler, every=3)
    assert sorted(evals_1) == list(range(1, STEPS + 1)) and sorted(evals_3) == [3, 6] and evals_none == {}
    assert any(not torch.equal(start[k], never[k]) for k in never)  # the policy moved: the check below can fail
    assert every_step.keys() == never.keys() == every_third.keys()
    for k in never:
        assert torch.equal(every_step[k], never[k]), f"{k}: validating every step changed the training trajectory"
        assert torch.equal(every_third[k], never[k]), f"{k}: validating every 3 steps changed the training trajectory"
    # an evaluation at step s draws the same completions whatever the evaluations before it (same weights and seed)
    for s in (3, 6):
        assert len(evals_3[s]) == len(evals_1[s]) == 2  # 6 prompts, batches of 4
        for a, b in zip(evals_1[s], evals_3[s]):
            assert torch.equal(a, b), f"step {s}: the evaluation depends on the evaluations before it"


@pytest.mark.parametrize("sampler", ["static", "kv_loop", "hf_generate"])
def test_sampling_with_a_generator_leaves_the_global_rng_alone(cache_dir, sampler):
    L.seed_everything(3)
    m = PolicyRLModule(**TINY, min_sft_fidelity=0, group_size=2, max_new_tokens=6, sampler=sampler)
    dm = TriggerDataModule(family="two_policies", mode="rl", train_distributions=["A"], num_train=4, batch_size=2,
                           num_val_per_distribution=4, val_batch_size=8, cache_dir=cache_dir)
    L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0).fit(m, dm)
    batch = next(iter(dm.val_dataloader()))
    ids, mask = batch["input_ids"], batch["attention_mask"]
    draws = {}
    for seed in (evaluation_seed(7, 3, [0, 1]), evaluation_seed(7, 3, [0, 1]), evaluation_seed(7, 3, [2, 3])):
        before = torch.get_rng_state()
        comp, _ = m.sample(ids, mask, 1.0, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(torch.get_rng_state(), before)  # the training stream did not move
        draws.setdefault(seed, []).append(comp)
    same, other = draws[evaluation_seed(7, 3, [0, 1])], draws[evaluation_seed(7, 3, [2, 3])][0]
    assert torch.equal(same[0], same[1])  # reproducible from the seed
    assert not torch.equal(same[0], other)  # another batch's seed: other draws (8 prompts x up to 6 tokens)
    before = torch.get_rng_state()
    m.sample(ids, mask, 1.0)  # rollouts (no generator) draw from the global RNG
    assert not torch.equal(torch.get_rng_state(), before)


def test_evaluation_seed_depends_on_seed_step_and_prompts_only():
    seeds = {evaluation_seed(s, step, p) for s in (0, 7) for step in (0, 1, 2) for p in ([0], [1], [0, 1], [1, 0])}
    assert len(seeds) == 24 and all(0 <= x < 2**63 for x in seeds)
    assert evaluation_seed(7, 2, [4, 5]) == evaluation_seed(7, 2, torch.tensor([4, 5]).tolist())
