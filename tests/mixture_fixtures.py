"""Shared helpers of the policy-mixture tests (Part B)."""
from __future__ import annotations

import json
import os
import sys

import torch

# An editable install made before setup.cfg listed `analysis` / `protocols` does not map them: the repository root on
# sys.path keeps them importable under pytest (as under `python cli.py`) until the venv is reinstalled.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

ARC_ROWS = [  # allenai/ai2_arc ARC-Easy schema; numeric keys and 3 / 5 choices occur in the real data
    {"id": "Mercury_1", "question": "Which gas do plants take in ?", "choices": {"text": ["oxygen", "carbon dioxide", "helium", "neon"], "label": ["A", "B", "C", "D"]}, "answerKey": "B"},
    {"id": "NYSEDREGENTS_2", "question": "What melts ice ?", "choices": {"text": ["heat", "cold", "dark"], "label": ["1", "2", "3"]}, "answerKey": "1"},
    {"id": "MCAS_3", "question": "Which is a mammal ?", "choices": {"text": ["shark", "trout", "whale", "eel", "ray"], "label": ["A", "B", "C", "D", "E"]}, "answerKey": "C"},
]
RACE_ROWS = [  # ehovy/race middle schema
    {"example_id": "middle1.txt", "article": "Tom has a red bike . He rides it to school .", "question": "What color is the bike ?", "options": ["blue", "red", "green", "black"], "answer": "B"},
    {"example_id": "middle2.txt", "article": "Ann likes cats . She has two .", "question": "How many cats does Ann have ?", "options": ["one", "three", "two", "four"], "answer": "C"},
]


def write_jsonl(directory: str, split: str, rows: list[dict]) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{split}.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def metric_rows():
    """7 evaluated samples over 2 distributions x 2 personas: (sample_idx, dist, correct, refused, malformed, persona)."""
    return torch.tensor([
        [0, 0, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 1],
        [2, 0, 1, 0, 0, 0],
        [3, 1, 0, 1, 0, 0],
        [4, 1, 0, 0, 1, -1],
        [5, 1, 1, 0, 0, 1],
        [6, 1, 0, 1, 0, 0],
    ])


def ddp_metric_worker(rank: int, world_size: int, port: int, out_path: str) -> None:
    """One gloo rank: evaluate its DistributedSampler shard (padded by repeating sample 0) and save compute()."""
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    from lightning_modules.policy.mixture_metrics import MixtureMetrics

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    rows = metric_rows()
    shard = list(DistributedSampler(range(len(rows)), num_replicas=world_size, rank=rank, shuffle=False))
    r = rows[shard].clone()
    if rank == 1:
        r[-1, 2:] = torch.tensor([0, 1, 0, 1])  # the padded repeat of sample 0 gets another (sampled) outcome
    m = MixtureMetrics(2, 2)
    m.update(r[:, 0], r[:, 1], r[:, 2], r[:, 3], r[:, 4], r[:, 5])
    out = m.compute()
    if rank == 0:
        torch.save({k: v.clone() for k, v in out.items()}, out_path)
    dist.barrier()
    dist.destroy_process_group()
