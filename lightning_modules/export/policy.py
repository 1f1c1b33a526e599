"""A Part B policy checkpoint (`PolicySFTModule` / `PolicyRLModule`) -> an `AutoModelForCausalLM` directory with
its `PreTrainedTokenizerFast`, so `transformers.pipeline("text-generation")` reproduces the persona behaviour.

The tokenizer is the one the run trained with: rebuilt from the checkpoint's datamodule hyperparameters (the
word-level tokenizers are built from the family's vocabulary) and checked against the checkpoint's fingerprint.
How a prompt reaches the model is what the training code does (`encode_prompt`), and the card says how to ask the
pipeline for the same ids:
- a tokenizer with a chat template (SmolLM2, Qwen-Instruct): the prompt is the user turn of a chat, rendered by the
  template with the generation prompt. The pipeline does this for a list of messages, not for a string: the card
  passes `[{"role": "user", "content": prompt}]`.
- no chat template: BOS + text. A word-level tokenizer gets a post-processor that writes that BOS, so
  `tokenizer(text)` (what the pipeline calls on a string) gives the training ids.
A LoRA policy (`--model.lora`) is exported merged: its adapters are added into the base weights
(`lightning_modules.policy.lora.load_trained_lm`, as a stage started from it loads it), so the directory is a plain
`AutoModelForCausalLM` with no peft dependency. The generation config carries EOS, pad and the evaluation's token
budget; greedy by default. The check runs the card's own call (the pipeline on the written directory) on held-out
prompts and compares its prompt ids and greedy completions with the training code's (on the merged model).
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Optional

import torch
import yaml

from lightning_modules.export.reward_model import ExportError


def uses_chat(tok) -> bool:
    """Prompts go through the chat template (`encode_prompt`): the pipeline must be given messages."""
    return bool(getattr(tok, "chat_template", None))


def pipeline_input(tok, prompt: str):
    """What the card passes to `pipeline("text-generation")` for one prompt: a one-turn chat, or the text."""
    return [{"role": "user", "content": prompt}] if uses_chat(tok) else prompt


def pipeline_prompt_ids(tok, prompt: str) -> list[int]:
    """The ids `pipeline("text-generation")` feeds the model for `pipeline_input(tok, prompt)` (its preprocess:
    `apply_chat_template(..., add_generation_prompt=True)` for a chat, `tokenizer(text)` for a string)."""
    if uses_chat(tok):
        enc = tok.apply_chat_template(pipeline_input(tok, prompt), add_generation_prompt=True, return_dict=True)
        return list(enc["input_ids"])
    return tok(prompt)["input_ids"]


def prompt_ids_match(tok, texts: list[str]) -> bool:
    from datamodules.triggers.datamodule import encode_prompt

    return all(pipeline_prompt_ids(tok, t) == encode_prompt(tok, t) for t in texts)


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
    """Our evaluation's sampler, greedy, one prompt at a time (the policy modules' path; unpadded like the pipeline's
    single prompts, so padding's float rounding cannot flip a near-tie between the two sides)."""
    from datamodules.triggers.datamodule import encode_prompt, left_pad
    from lightning_modules.fast.kv_cache_sampling import sample_with_kv_cache

    out = []
    for p in prompts:
        ids, mask = left_pad([encode_prompt(tok, p)], tok.pad_token_id)
        comp, cmask = sample_with_kv_cache(model, ids, mask, max_new_tokens, 0.0, tok.eos_token_id, tok.pad_token_id)
        out.append(comp[0][cmask[0].bool()].tolist())
    return out


@torch.no_grad()
def greedy_exported(directory: str, prompts: list[str]) -> tuple[list[list[int]], list[str], object]:
    """What the card tells a plain transformers user to run, on the written directory: `pipeline("text-generation")`
    with the card's input (a chat or the text). Returns the completions' ids (to the first EOS), their texts, and
    the loaded tokenizer."""
    from transformers import pipeline

    generate = pipeline("text-generation", model=directory)
    tok = generate.tokenizer
    ids, texts = [], []
    for p in prompts:
        n = len(pipeline_prompt_ids(tok, p))
        seq = list(generate(pipeline_input(tok, p), return_tensors=True)[0]["generated_token_ids"][n:])
        ids.append(seq[: seq.index(tok.eos_token_id) + 1] if tok.eos_token_id in seq else seq)
        texts.append(tok.decode(seq, skip_special_tokens=True))  # the pipeline's generated_text (return_full_text=False)
    return ids, texts, tok


def export_policy(ckpt: dict, ckpt_path: str, out_dir: str, lora_only: bool = False,
                  results: Optional[str] = None) -> dict:
    from transformers import AutoTokenizer

    from datamodules.triggers.datamodule import TriggerDataModule
    from lightning_modules.policy.causal_lm import build_causal_lm, tokenizer_fingerprint
    from lightning_modules.policy.lora import as_lora_spec, load_trained_lm

    if lora_only:
        raise ExportError("--lora_only: a policy is exported whole (a LoRA policy with its adapters merged: they sit "
                          "on its start checkpoint's weights, not on a hub model's); drop the flag")
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
    state = {k[len("model."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    try:
        model = load_trained_lm(model, state, as_lora_spec(hp.get("lora")), f"--ckpt_path {ckpt_path!r}")
    except ValueError as err:
        raise ExportError(str(err)) from err
    model.eval()
    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    gen.max_new_tokens, gen.do_sample = int(hp.get("max_new_tokens", 24)), False

    items = check_prompts(dm)
    prompts = [it["prompt"] for it in items]
    if not uses_chat(tok) and not prompt_ids_match(tok, prompts):
        add_bos_on_encode(tok)
    if not prompt_ids_match(tok, prompts):
        raise ExportError("the tokenizer cannot give `pipeline(\"text-generation\")` the training prompts' ids (" +
                          ("the chat template's user turn + generation prompt" if uses_chat(tok) else "BOS + text") + ")")
    ours = greedy_ours(model, tok, prompts, gen.max_new_tokens)

    final_dir = os.path.abspath(out_dir)
    tmp = f"{final_dir}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        loaded_tok = AutoTokenizer.from_pretrained(tmp)
        from datamodules.triggers.datamodule import encode_prompt

        bad = [p for p in prompts if pipeline_prompt_ids(loaded_tok, p) != encode_prompt(tok, p)]
        if bad:
            raise ExportError(f"the saved tokenizer, loaded back, encodes {len(bad)} of {len(prompts)} held-out prompts "
                              f"differently from training (e.g. {bad[0]!r}); nothing was written")
        theirs, texts, loaded_tok = greedy_exported(tmp, prompts)
        same = sum(a == b for a, b in zip(ours, theirs))
        if same < len(prompts):
            raise ExportError(f"the exported policy's greedy completions differ from ours on {len(prompts) - same} "
                              f"of {len(prompts)} held-out prompts; nothing was written")
        examples = [(it["dist"], it["prompt"], t.strip()) for it, t in zip(items, texts)]
        facts = {"kind": f"{type(model).__name__} + {type(loaded_tok).__name__}", "family": dm.family.name,
                 "personas": list(dm.family.personas), "distributions": list(dm.family.distributions),
                 "fidelity": ckpt.get("persona_fidelity"), "checked_prompts": len(prompts),
                 "checkpoint": os.path.abspath(ckpt_path), "examples": examples, "chat": uses_chat(tok)}
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
    if facts["chat"]:
        call = f'[{{"role": "user", "content": {prompt!r}}}]'
        how = ("The prompt is the user turn of a chat: pass it as a message list, so the pipeline renders it with "
               "the tokenizer's chat template and generation prompt, as in training. A plain string would reach the "
               "model without the template, which this policy never saw.\n\n")
    else:
        call, how = repr(prompt), ("The prompt is plain text (the tokenizer writes the BOS it was trained with).\n\n")
    usage = how + f'''```python
from transformers import pipeline

generate = pipeline("text-generation", model={out_dir!r})
print(generate({call}, return_full_text=False)[0]["generated_text"])
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
    prov = (f"Checkpoint `{facts['checkpoint']}`.\n\nGreedy completions of held-out prompts by the call above (the "
            f"same ids as the training code's on all {facts['checked_prompts']} checked):\n\n| distribution | prompt | completion |\n"
            f"|---|---|---|\n{rows}")
    front = {"library_name": "transformers", "pipeline_tag": "text-generation", "tags": ["shiftgen", "policy-mixture"]}
    card = yaml.safe_dump(front, sort_keys=False).strip()
    return (f"---\n{card}\n---\n\n# Policy mixture (shiftgen export)\n\n{summary}\n\n## Use\n\n{usage}\n\n"
            f"## Provenance and behaviour\n\n{prov}\n")
