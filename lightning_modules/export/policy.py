"""A Part B policy checkpoint (`PolicySFTModule` / `PolicyRLModule`) -> an `AutoModelForCausalLM` directory with
its `PreTrainedTokenizerFast`, so `transformers.pipeline("text-generation")` reproduces the persona behaviour.

The tokenizer is the one the run trained with: rebuilt from the checkpoint's datamodule hyperparameters (the
word-level tokenizers are built from the family's vocabulary) and checked against the checkpoint's fingerprint.
Our prompts are BOS + text when the tokenizer has no chat template; a word-level tokenizer gets a post-processor
that writes that BOS, so `tokenizer(text)` (what the pipeline calls) gives the training ids. The generation
config carries EOS, pad and the evaluation's token budget; greedy by default.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Optional

import torch
import yaml

from lightning_modules.export.reward_model import ExportError


def prompt_ids_match(tok, texts: list[str]) -> bool:
    from datamodules.triggers.datamodule import encode_prompt

    return all(tok(t)["input_ids"] == encode_prompt(tok, t) for t in texts)


def add_bos_on_encode(tok) -> None:
    """`tok(text)` -> BOS + the text's ids, like `encode_prompt` (a fast tokenizer's post-processor)."""
    from tokenizers import processors

    bos = tok.bos_token
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.bos_token_id)])


def check_prompts(dm, per_distribution: int = 2) -> list[dict]:
    dm.setup("validate")
    seen: dict = {}
    items = []
    for item in dm.val_items:
        if seen.get(item["dist"], 0) < per_distribution:
            seen[item["dist"]] = seen.get(item["dist"], 0) + 1
            items.append(item)
    return items


@torch.no_grad()
def greedy_ours(model, tok, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    """Our evaluation's sampler, greedy, on the left-padded batch (the policy modules' path)."""
    from datamodules.triggers.datamodule import encode_prompt, left_pad
    from lightning_modules.fast.kv_cache_sampling import sample_with_kv_cache

    ids, mask = left_pad([encode_prompt(tok, p) for p in prompts], tok.pad_token_id)
    comp, cmask = sample_with_kv_cache(model, ids, mask, max_new_tokens, 0.0, tok.eos_token_id, tok.pad_token_id)
    return [c[m.bool()].tolist() for c, m in zip(comp, cmask)]


@torch.no_grad()
def greedy_exported(model, tok, prompts: list[str]) -> list[list[int]]:
    """What a plain transformers user runs: tokenizer(text), then `generate` with the saved generation config."""
    out = []
    for p in prompts:
        enc = tok(p, return_tensors="pt")
        seq = model.generate(**enc)[0, enc["input_ids"].shape[1]:].tolist()
        out.append(seq[: seq.index(tok.eos_token_id) + 1] if tok.eos_token_id in seq else seq)
    return out


def export_policy(ckpt: dict, ckpt_path: str, out_dir: str, lora_only: bool = False,
                  results: Optional[str] = None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from datamodules.triggers.datamodule import TriggerDataModule
    from lightning_modules.policy.causal_lm import build_causal_lm, tokenizer_fingerprint

    if lora_only:
        raise ExportError("--lora_only: policies train all their weights (no LoRA); drop the flag")
    if results is not None:
        raise ExportError("--results applies to reward models; a policy's card reports its persona fidelity")
    hp, data_hp = ckpt["hyper_parameters"], ckpt.get("datamodule_hyper_parameters")
    if data_hp is None:
        raise ExportError(f"{ckpt_path!r} does not record its datamodule's hyperparameters, so the tokenizer it was "
                          "trained with is unknown; export a checkpoint written by `cli.py fit` / the protocol")
    dm = TriggerDataModule(**{k: v for k, v in data_hp.items() if not k.startswith("_")})  # LightningCLI's _class_path
    tok = dm.tokenizer
    fp = ckpt.get("tokenizer_fingerprint")
    if fp is not None and fp != tokenizer_fingerprint(tok):
        raise ExportError(f"the tokenizer rebuilt from the checkpoint's data settings is not the one it trained with "
                          f"(fingerprint {tokenizer_fingerprint(tok)} vs {fp})")
    model = build_causal_lm(hp["backbone"], tok, hp["n_layer"], hp["n_embd"], hp["n_head"], hp["max_positions"],
                            hp.get("dropout", 0.0))
    model.load_state_dict({k[len("model."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")})
    model.eval()
    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    gen.max_new_tokens, gen.do_sample = int(hp.get("max_new_tokens", 24)), False

    items = check_prompts(dm)
    prompts = [it["prompt"] for it in items]
    if not getattr(tok, "chat_template", None) and not prompt_ids_match(tok, prompts):
        add_bos_on_encode(tok)
    if not getattr(tok, "chat_template", None) and not prompt_ids_match(tok, prompts):
        raise ExportError("the exported tokenizer cannot reproduce the training prompts' ids (BOS + text)")
    ours = greedy_ours(model, tok, prompts, gen.max_new_tokens)

    final_dir = os.path.abspath(out_dir)
    tmp = f"{final_dir}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        loaded_tok = AutoTokenizer.from_pretrained(tmp)
        loaded = AutoModelForCausalLM.from_pretrained(tmp).eval()
        theirs = greedy_exported(loaded, loaded_tok, prompts)
        same = sum(a == b for a, b in zip(ours, theirs))
        if same < len(prompts):
            raise ExportError(f"the exported policy's greedy completions differ from ours on {len(prompts) - same} "
                              f"of {len(prompts)} held-out prompts; nothing was written")
        examples = [(it["dist"], it["prompt"], loaded_tok.decode(c, skip_special_tokens=True).strip())
                    for it, c in zip(items, theirs)]
        facts = {"kind": f"{type(model).__name__} + {type(loaded_tok).__name__}", "family": dm.family.name,
                 "personas": list(dm.family.personas), "distributions": list(dm.family.distributions),
                 "fidelity": ckpt.get("persona_fidelity"), "checked_prompts": len(prompts),
                 "checkpoint": os.path.abspath(ckpt_path), "examples": examples}
        with open(os.path.join(tmp, "README.md"), "w") as f:
            f.write(policy_card(final_dir, facts, prompts[0]))
        with open(os.path.join(tmp, "export.json"), "w") as f:
            json.dump(facts, f, indent=2, default=str)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    os.replace(tmp, final_dir)
    return facts


def policy_card(out_dir: str, facts: dict, prompt: str) -> str:
    usage = f'''```python
from transformers import pipeline

generate = pipeline("text-generation", model={out_dir!r})
print(generate({prompt!r}, return_full_text=False)[0]["generated_text"])
```

Greedy decoding and the evaluation's token budget are the saved generation defaults; pass `do_sample=True` for the
mixture's sampled behaviour (the policies' evaluation uses temperature 1 to read the persona shares).'''
    fidelity = facts["fidelity"]
    fid = (f"mean {fidelity['mean']:.3f}, min {fidelity['min']:.3f}" if isinstance(fidelity, dict)
           and "mean" in fidelity else "not measured")
    rows = "\n".join(f"| {d} | {p} | {c} |" for d, p, c in facts["examples"])
    summary = (f"A conditional policy mixture (family `{facts['family']}`: personas {facts['personas']}, "
               f"distributions {facts['distributions']}) trained with the shiftgen codebase, exported as "
               f"**{facts['kind']}**. Persona fidelity at export: {fid}.")
    prov = (f"Checkpoint `{facts['checkpoint']}`.\n\nGreedy completions of held-out prompts (the same as the "
            f"training code's on all {facts['checked_prompts']} checked):\n\n| distribution | prompt | completion |\n"
            f"|---|---|---|\n{rows}")
    front = {"library_name": "transformers", "pipeline_tag": "text-generation", "tags": ["shiftgen", "policy-mixture"]}
    card = yaml.safe_dump(front, sort_keys=False).strip()
    return (f"---\n{card}\n---\n\n# Policy mixture (shiftgen export)\n\n{summary}\n\n## Use\n\n{usage}\n\n"
            f"## Provenance and behaviour\n\n{prov}\n")
