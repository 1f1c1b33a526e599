"""A `RewardModelModule` checkpoint -> a Hugging Face directory that scores exactly as the module does.

- Decoder backbone (Qwen2, Llama, Gemma, GPT-2, ...: every family whose `…ForSequenceClassification` reads the
  rightmost non-pad token) with "last" pooling -> that class, num_labels=1, our head's weight as its `score`
  (neither has a bias). HF finds the last token by `config.pad_token_id`, we by the attention mask: they agree
  unless the last real token *is* the pad token, which happens when the pad token is the EOS our pair format ends
  with. Then the export gives the tokenizer a new pad token (and the embedding table a never-read row).
  LoRA is merged, or with `lora_only` saved as a PEFT adapter (task SEQ_CLS, `score` in modules_to_save).
- Encoder backbones (MiniLM/BERT) or mean pooling: no HF class pools the same way. The backbone is saved as a
  plain `AutoModel` directory with `reward_head.safetensors`, and the card carries the loader (a few lines).
- Quantized backbones and outside classifiers are refused before anything is loaded.
Before the directory appears, the written files are loaded back (by the card's own code for the second kind) and
scored against the module on probe sequences, right and left padded; a difference refuses the export.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Optional

import torch
from torch import nn

from lightning_modules.export.model_card import gather_provenance, render_card

NEW_PAD_TOKEN = "<|reward_pad|>"


class ExportError(ValueError):
    """An export that would not score like the module: refused, with the reason."""


def refuse_unexportable(hp: dict, lora_only: bool) -> None:
    if hp.get("quantization"):
        raise ExportError(
            f"the checkpoint's backbone is quantized (--model.quantization {hp['quantization']}): bitsandbytes "
            "weights cannot be written as a standard transformers model that scores the same. Train without "
            "quantization (bf16 LoRA) to export.")
    if hp.get("vocab_limit") is not None:
        raise ExportError(f"the checkpoint reads token ids >= {hp['vocab_limit']} as unknown (--model.vocab_limit): "
                          "no transformers class does that, so an export would score differently")
    if str(hp.get("backbone", "")).startswith("hf_classifier:"):
        raise ExportError(f"the checkpoint wraps an outside classifier ({hp['backbone']}): it is already a "
                          "transformers directory")
    if lora_only and not hp.get("lora"):
        raise ExportError("--lora_only: the checkpoint has no LoRA adapters (trained without --model.lora)")


# ---- probe sequences and scoring ----------------------------------------------------------------------------------
def pad_rows(rows: list[list[int]], pad_id: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (N, T)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (N, T)
    for i, r in enumerate(rows):
        start = width - len(r) if side == "left" else 0
        ids[i, start:start + len(r)] = torch.tensor(r)
        mask[i, start:start + len(r)] = 1
    return ids, mask


def probe_rows(tok, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Random ordinary tokens in our pair layout (prefix ... suffix), of different lengths."""
    from datamodules.preference.pair_tokenization import PairTokenizer

    pt = PairTokenizer(tok, max_length=64)
    special = set(tok.all_special_ids)
    ordinary = torch.tensor([i for i in range(min(vocab_size, len(tok))) if i not in special])
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in (3, 11, 6, 17, 9):
        body = ordinary[torch.randint(len(ordinary), (n,), generator=g)].tolist()
        rows.append(pt.prefix + body[: n // 2] + pt.separator + body[n // 2:] + pt.suffix)
    return rows


@torch.no_grad()
def module_scores(module, rows: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    return {side: module(*pad_rows(rows, pad_id, side))[0].float() for side in ("right", "left")}


def compare(expected: dict, got: dict, dtype: torch.dtype) -> float:
    """Largest |difference| over both padding sides; raises when it exceeds float rounding of `dtype`."""
    worst = max(float((expected[s] - got[s]).abs().max()) for s in expected)
    scale = max(1.0, max(float(v.abs().max()) for v in expected.values()))
    tol = (1e-4 if dtype == torch.float32 else 3e-2) * scale
    if not worst <= tol:
        raise ExportError(f"the exported model scores differently from the checkpoint (max |Δ reward| {worst:.3g} "
                          f"> {tol:.3g} on probe sequences); nothing was written")
    return worst


# ---- the loader code written into the card (and run by the export check) --------------------------------------------
def input_code(tok) -> str:
    """`reward_input(messages, response)`: the ids the module was trained on (`pair_tokenization.PairTokenizer`)."""
    from datamodules.preference.pair_tokenization import PairTokenizer, is_encoder_tokenizer

    pt = PairTokenizer(tok, max_length=64)
    ending = "" if is_encoder_tokenizer(tok) else ' + "\\nassistant:"'
    return f'''PREFIX, SEPARATOR, SUFFIX = {pt.prefix}, {pt.separator}, {pt.suffix}


def reward_input(messages: list, response: str) -> list:
    """[prefix] prompt [separator] response [suffix]: the layout this model was trained and tested on."""
    if tok.chat_template:
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        prompt = "\\n".join(f"{{m['role']}}: {{m['content']}}" for m in messages){ending}
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    if PREFIX and prompt.startswith(tok.decode(PREFIX)):
        ids = ids[len(PREFIX):]  # the chat template wrote BOS already
    return PREFIX + ids + SEPARATOR + tok(response, add_special_tokens=False)["input_ids"] + SUFFIX


@torch.no_grad()
def rewards(messages: list, responses: list) -> torch.Tensor:
    batch = tok.pad({{"input_ids": [reward_input(messages, r) for r in responses]}}, return_tensors="pt")
    return score_ids(batch["input_ids"], batch["attention_mask"])
'''


def classifier_code(out_dir: str, adapter_base: Optional[str], pad_id: int, tok_class: str = "AutoTokenizer") -> str:
    load, peft = "rm = AutoModelForSequenceClassification.from_pretrained(D).eval()", ""
    if adapter_base is not None:
        peft = "from peft import PeftModel\n"
        load = (f"base = AutoModelForSequenceClassification.from_pretrained({adapter_base!r}, num_labels=1, "
                f"pad_token_id={pad_id})\nrm = PeftModel.from_pretrained(base, D).eval()")
    return f'''import torch
{peft}from transformers import AutoModelForSequenceClassification, {tok_class}

D = {out_dir!r}
tok = {tok_class}.from_pretrained(D){TOK_COMMENT if tok_class != "AutoTokenizer" else ""}
{load}


def score_ids(input_ids, attention_mask):  # (N, T) -> (N,)
    return rm(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0].float()
'''


def head_code(out_dir: str, tok_class: str = "AutoTokenizer") -> str:
    return f'''import json

import torch
from safetensors.torch import load_file
from transformers import AutoModel, {tok_class}

D = {out_dir!r}
tok = {tok_class}.from_pretrained(D){TOK_COMMENT if tok_class != "AutoTokenizer" else ""}
backbone = AutoModel.from_pretrained(D).eval()
w = load_file(f"{{D}}/reward_head.safetensors")["weight"]  # (1, H): the linear head, no bias
POOLING = json.load(open(f"{{D}}/reward_head.json"))["pooling"]


def score_ids(input_ids, attention_mask):  # (N, T) -> (N,)
    h = backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (N, T, H)
    if POOLING == "mean":  # mean over the non-padding tokens
        m = attention_mask.unsqueeze(-1).to(h.dtype)  # (N, T, 1)
        pooled = (h * m).sum(1) / m.sum(1).clamp_min(1.0)
    else:  # the last non-padding token, left or right padding
        last = (attention_mask * torch.arange(attention_mask.shape[1])).argmax(1)  # (N,)
        pooled = h[torch.arange(len(h)), last]
    return (pooled.to(w.dtype) @ w.T).squeeze(-1).float()
'''


TOK_COMMENT = "  # not AutoTokenizer: it would swap in the architecture's own text splitting"


def tokenizer_class_that_loads(tok, directory: str) -> str:
    """The transformers class whose `from_pretrained(directory)` encodes like `tok`. AutoTokenizer is preferred, but
    for some architectures (Qwen2 in transformers 5) it forces the family's tokenizer class, which rebuilds the
    text splitting and mangles a word-level tokenizer; `PreTrainedTokenizerFast` reads tokenizer.json as written."""
    import transformers

    texts = ["user: How do I boil an egg?\nassistant:", "Simmer it for 9 minutes.", "hello , how are you ?"]
    want = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    for name in ("AutoTokenizer", "PreTrainedTokenizerFast"):
        loaded = getattr(transformers, name).from_pretrained(directory)
        if [loaded(t, add_special_tokens=False)["input_ids"] for t in texts] == want and \
                loaded.pad_token_id == tok.pad_token_id and loaded.padding_side == tok.padding_side:
            return name
    raise ExportError("the saved tokenizer does not load back as the one the model was trained with")


def run_loader(code: str) -> dict:
    namespace: dict = {}
    exec(compile(code, "<model card>", "exec"), namespace)  # the card's own code, on the written files
    return namespace


# ---- the two kinds of export --------------------------------------------------------------------------------------
def last_token_classifier_class(base: nn.Module):
    """The `…ForSequenceClassification` class for `base`'s config when it pools the rightmost non-pad token on
    top of exactly `base`'s architecture; None otherwise."""
    from transformers import AutoModelForSequenceClassification
    from transformers.modeling_layers import GenericForSequenceClassification

    cls = AutoModelForSequenceClassification._model_mapping.get(type(base.config), None)
    if cls is None or not (issubclass(cls, GenericForSequenceClassification)
                           or cls.__name__ == "GPT2ForSequenceClassification"):
        return None
    with torch.device("meta"):
        probe = cls(base.config)
    return cls if type(getattr(probe, probe.base_model_prefix)) is type(base) else None


def _absolute_positions(backbone: nn.Module) -> bool:
    """A learned position table (GPT-2's `wpe`, BERT's `position_embeddings`) read at 0..T-1 whatever the padding."""
    names = {n.rsplit(".", 1)[-1] for n, _ in backbone.named_modules()}
    return bool(names & {"wpe", "position_embeddings"})


def _needs_new_pad(tok) -> bool:
    from datamodules.preference.pair_tokenization import PairTokenizer

    suffix = PairTokenizer(tok, max_length=64).suffix
    return bool(suffix) and suffix[-1] == tok.pad_token_id  # the last real token would read as padding


def _give_new_pad_token(tok, base: nn.Module) -> None:
    tok.add_special_tokens({"pad_token": NEW_PAD_TOKEN})
    table = base.get_input_embeddings()
    if tok.pad_token_id >= table.num_embeddings:
        old = table.num_embeddings
        base.resize_token_embeddings(tok.pad_token_id + 1, mean_resizing=False)
        with torch.no_grad():
            base.get_input_embeddings().weight[old:].zero_()  # only ever at padded positions: never read
    base.config.pad_token_id = tok.pad_token_id


def write_classifier(module, cls, tok, tmp: str, final_dir: str, lora_only: bool) -> dict:
    """The `…ForSequenceClassification` export (merged, or a PEFT adapter); returns the card's facts."""
    head_weight = module.head.score.weight.detach()  # (1, H)
    backbone = module.backbone
    facts: dict = {"kind": f"{cls.__name__} (AutoModelForSequenceClassification, num_labels=1)", "adapter_base": None,
                   "absolute_positions": _absolute_positions(backbone)}
    if _needs_new_pad(tok):
        if lora_only:
            raise ExportError(f"--lora_only: the tokenizer pads with its EOS token, which ends every scored sequence; "
                              f"the export must add a pad token ({NEW_PAD_TOKEN}) to the model, which an adapter "
                              "cannot carry. Export merged (drop --lora_only).")
        facts["new_pad"] = f"the tokenizer's pad token was its EOS token; the export added {NEW_PAD_TOKEN!r}"
    if lora_only:
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        lora = get_peft_model_state_dict(backbone)
        config = backbone.peft_config["default"]
        base = backbone.unload()  # the frozen base weights, adapters removed (not merged)
        prefix = cls.base_model_prefix  # "model", GPT-2's "transformer"
        tensors = {k.replace("base_model.model.", f"base_model.model.{prefix}.", 1): v.contiguous() for k, v in lora.items()}
        tensors["base_model.model.score.weight"] = head_weight.to(next(base.parameters()).dtype).contiguous()
        hp = module.hparams
        if hp.backbone.startswith("tiny-") or hp.keep_layers is not None:  # no hub/dir holds this exact base
            base_dir = os.path.join(tmp, "base")
            base.config.pad_token_id = tok.pad_token_id
            _classifier(cls, base, torch.zeros_like(head_weight)).save_pretrained(base_dir)
            facts["adapter_base"] = os.path.join(final_dir, "base")
        else:
            from datamodules.tokenizers import resolve_pretrained

            facts["adapter_base"] = resolve_pretrained(hp.backbone)
        config.task_type, config.modules_to_save = "SEQ_CLS", ["score"]
        config.base_model_name_or_path = facts["adapter_base"]
        config.save_pretrained(tmp)
        save_file(tensors, os.path.join(tmp, "adapter_model.safetensors"))
        facts["kind"] = f"PEFT LoRA adapter (task SEQ_CLS) for {cls.__name__}"
        facts["check_base"] = os.path.join(tmp, "base") if os.path.isdir(os.path.join(tmp, "base")) else facts["adapter_base"]
    else:
        base = backbone.merge_and_unload() if hasattr(backbone, "peft_config") else backbone
        if "new_pad" in facts:
            _give_new_pad_token(tok, base)
        base.config.pad_token_id = tok.pad_token_id
        _classifier(cls, base, head_weight).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    return facts


def _classifier(cls, base: nn.Module, head_weight: torch.Tensor) -> nn.Module:
    """`cls` around our own base module (no copy, nothing left on the meta device) with `head_weight` as score."""
    import copy

    config = copy.deepcopy(base.config)
    config.num_labels, config.id2label, config.label2id = 1, {0: "reward"}, {"reward": 0}
    config.architectures = [cls.__name__]
    with torch.device("meta"):
        clf = cls(config)
    setattr(clf, clf.base_model_prefix, base)
    dtype = next(base.parameters()).dtype
    clf.score = nn.Linear(head_weight.shape[1], 1, bias=False, dtype=dtype)
    with torch.no_grad():
        clf.score.weight.copy_(head_weight.to(dtype))
    leftovers = [n for n, t in [*clf.named_parameters(), *clf.named_buffers()] if t.is_meta]
    if leftovers:
        raise ExportError(f"{cls.__name__} has parts our backbone lacks: {leftovers[:5]}")
    return clf


def write_backbone_and_head(module, tok, tmp: str) -> dict:
    from safetensors.torch import save_file

    backbone = module.backbone
    base = backbone.merge_and_unload() if hasattr(backbone, "peft_config") else backbone
    base.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    save_file({"weight": module.head.score.weight.detach().contiguous()}, os.path.join(tmp, "reward_head.safetensors"))
    with open(os.path.join(tmp, "reward_head.json"), "w") as f:
        json.dump({"pooling": module.head.pooling, "bias": False}, f)
    return {"kind": f"{type(base).__name__} (AutoModel) + reward_head.safetensors ({module.head.pooling} pooling)",
            "adapter_base": None, "absolute_positions": _absolute_positions(base)}


# ---- the command ----------------------------------------------------------------------------------------------------
def export_reward_model(ckpt: dict, ckpt_path: str, out_dir: str, lora_only: bool = False,
                        results: Optional[str] = None) -> dict:
    from datamodules.tokenizers import load_tokenizer
    from lightning_modules.reward.reward_model import RewardModelModule

    hp = {k: v for k, v in ckpt["hyper_parameters"].items() if not k.startswith("_")}  # LightningCLI's _class_path
    refuse_unexportable(hp, lora_only)
    prov = gather_provenance(ckpt, ckpt_path, results)
    module = RewardModelModule(**hp)
    module.load_state_dict(ckpt["state_dict"])
    module.eval()
    tok = load_tokenizer(module.tokenizer_name)
    vocab = module.backbone.get_input_embeddings().num_embeddings
    rows = probe_rows(tok, vocab)
    expected = module_scores(module, rows, tok.pad_token_id)
    dtype = next(module.backbone.parameters()).dtype
    base = module.backbone.get_base_model() if hasattr(module.backbone, "peft_config") else module.backbone
    cls = last_token_classifier_class(base) if module.head.pooling == "last" else None
    if cls is None and lora_only:
        raise ExportError(f"--lora_only: {type(base).__name__} with {module.head.pooling} pooling has no transformers "
                          "class that carries our head; export merged (drop --lora_only)")

    final_dir = os.path.abspath(out_dir)
    tmp = f"{final_dir}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        if cls is not None:
            facts = write_classifier(module, cls, tok, tmp, final_dir, lora_only)
            tok_class = tokenizer_class_that_loads(tok, tmp)
            code = classifier_code(final_dir, facts["adapter_base"], tok.pad_token_id, tok_class)
            check_code = classifier_code(tmp, facts.get("check_base"), tok.pad_token_id, tok_class)
        else:
            facts = write_backbone_and_head(module, tok, tmp)
            tok_class = tokenizer_class_that_loads(tok, tmp)
            code, check_code = head_code(final_dir, tok_class), head_code(tmp, tok_class)
        check_dir = tmp
        code, check_code = code + "\n\n" + input_code(tok), check_code + "\n\n" + input_code(tok)
        loaded = run_loader(check_code)
        new_pad = loaded["tok"].pad_token_id
        with torch.no_grad():
            got = {s: loaded["score_ids"](*pad_rows(rows, new_pad, s)) for s in ("right", "left")}
        worst = compare(expected, got, dtype)
        facts.update(max_abs_diff=worst, dtype=str(dtype).replace("torch.", ""), padding_side=tok.padding_side,
                     tokenizer_class=tok_class)
        with open(os.path.join(check_dir, "README.md"), "w") as f:
            f.write(reward_card(prov, facts, code))
        with open(os.path.join(check_dir, "export.json"), "w") as f:
            json.dump({"provenance": {k: v for k, v in prov.items() if k != "results"}, "results": prov["results"],
                       "export": facts}, f, indent=2, default=str)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    os.replace(tmp, final_dir)
    return facts


def reward_card(prov: dict, facts: dict, code: str) -> str:
    adapter = facts["adapter_base"] is not None
    summary = (f"A scalar reward model r(prompt, response) trained with the shiftgen codebase, exported as "
               f"**{facts['kind']}**. Higher is better; compare rewards of responses to the same prompt.")
    if "AutoModel)" in facts["kind"]:
        summary += ("\n\n**Not** an `AutoModelForSequenceClassification`: no transformers class pools like this "
                    "model (an encoder or mean pooling), so loading it as one would score with a random head. Load it "
                    "with the code below.")
    usage = ("Score prompt/response pairs with plain `transformers` (and `peft` for an adapter); `reward_input` "
             "builds the exact token layout the model was trained on:\n\n```python\n" + code + "\n\n"
             "print(rewards([{\"role\": \"user\", \"content\": \"How do I boil an egg?\"}],\n"
             "              [\"Simmer it for nine minutes.\", \"Eggs are round.\"]))\n```\n\n"
             f"The tokenizer pads on the **{facts['padding_side']}**, as in training."
             + (" Keep it so: this architecture's learned absolute positions make left-padded scores depend on the "
                "amount of padding." if facts.get("absolute_positions") else " Either side scores the same."))
    if adapter:
        usage += f" The adapter's base model: `{facts['adapter_base']}`."
    if "new_pad" in facts:
        usage += f" Note: {facts['new_pad']}, so pad with this tokenizer."
    check = (f"Loaded back with the code above and scored against the training module on probe sequences, right "
             f"and left padded: max |Δ reward| = {facts['max_abs_diff']:.2e} ({facts['dtype']}).")
    front = {"library_name": "peft" if adapter else "transformers", "pipeline_tag": "text-classification",
             "tags": ["reward-model", "shiftgen"]}
    return render_card("Reward model (shiftgen export)", front, summary, usage, prov, check)
