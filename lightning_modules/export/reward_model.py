"""A `RewardModelModule` checkpoint -> a Hugging Face directory that scores exactly as the module does.

- Decoder backbone (Qwen2, Llama, Gemma, GPT-2, ...: every family whose `…ForSequenceClassification` reads the
  rightmost non-pad token) with "last" pooling -> that class, num_labels=1, our head's weight as its `score`
  (neither has a bias). HF finds the last token by `config.pad_token_id`, we by the attention mask: they agree
  unless the last real token *is* the pad token, which happens when the pad token is the EOS our pair format ends
  with. Then the export gives the tokenizer a new pad token (and the embedding table a never-read row).
  LoRA is merged, or with `lora_only` saved as a PEFT adapter (task SEQ_CLS, `score` in modules_to_save).
  Its tokenizer gets a chat template that renders a TRL-style conversation (prompt + assistant response) as our
  layout, `[BOS] chat-template(prompt, add_generation_prompt) response [EOS]` (`conversation_template`).
- Encoder backbones (MiniLM/BERT) or mean pooling: no HF class pools the same way. The export is a
  `PooledRewardModel` (modeling_shiftgen_reward.py, copied beside the weights): it loads with
  `AutoModelForSequenceClassification.from_pretrained(D, trust_remote_code=True)`, and without the flag raises
  instead of building a random head.
- Quantized backbones and outside classifiers are refused before anything is loaded.
Before the directory appears, the written files are loaded back by the card's own code and scored against the module
on probe sequences, right and left padded, and through every other load path the card names (conversations and the
text-classification pipeline; the refused plain load of a pooled model); a difference refuses the export.
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


def classifier_code(out_dir: str, adapter_base: Optional[str], pad_id: int, tok_class: str = "AutoTokenizer",
                    remote_code: bool = False) -> str:
    load, peft = "rm = AutoModelForSequenceClassification.from_pretrained(D).eval()", ""
    if remote_code:
        load = ("# the pooling lives in modeling_shiftgen_reward.py beside the weights (torch + transformers only)\n"
                "rm = AutoModelForSequenceClassification.from_pretrained(D, trust_remote_code=True).eval()")
    if adapter_base is not None:
        peft = "from peft import PeftModel\n"
        load = (f"base = AutoModelForSequenceClassification.from_pretrained({adapter_base!r}, num_labels=1, "
                f"pad_token_id={pad_id})\nrm = PeftModel.from_pretrained(base, D).eval()")
    return f'''import torch
{peft}from transformers import AutoModelForSequenceClassification, {tok_class}

D = {out_dir!r}
tok = {tok_class}.from_pretrained(D{", trust_remote_code=True" if remote_code else ""}){TOK_COMMENT if tok_class != "AutoTokenizer" else ""}
{load}


def score_ids(input_ids, attention_mask):  # (N, T) -> (N,)
    return rm(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0].float()
'''


TOK_COMMENT = "  # not AutoTokenizer: it would swap in the architecture's own text splitting"


def tokenizer_class_that_loads(tok, directory: str, remote_code: bool = False) -> str:
    """The transformers class whose `from_pretrained(directory)` encodes like `tok`. AutoTokenizer is preferred, but
    for some architectures (Qwen2 in transformers 5) it forces the family's tokenizer class, which rebuilds the
    text splitting and mangles a word-level tokenizer; `PreTrainedTokenizerFast` reads tokenizer.json as written."""
    import transformers

    texts = ["user: How do I boil an egg?\nassistant:", "Simmer it for 9 minutes.", "hello , how are you ?"]
    want = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    for name in ("AutoTokenizer", "PreTrainedTokenizerFast"):
        # AutoTokenizer reads config.json, whose model type is the export's own for a pooled model
        loaded = getattr(transformers, name).from_pretrained(directory, **({"trust_remote_code": True}
                                                                           if remote_code else {}))
        if [loaded(t, add_special_tokens=False)["input_ids"] for t in texts] == want and \
                loaded.pad_token_id == tok.pad_token_id and loaded.padding_side == tok.padding_side:
            return name
    raise ExportError("the saved tokenizer does not load back as the one the model was trained with")


# ---- a conversation -> the trained layout, through the exported tokenizer's chat template ----------------------------
# render_prompt's plain format as a template (newlines as expressions: transformers renders with trim_blocks)
PLAIN_PROMPT = ("{%- for m in messages -%}{{ m['role'] + ': ' + m['content'] }}{%- if not loop.last -%}{{ '\\n' }}"
                "{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ '\\nassistant:' }}{%- endif -%}")


def conversation_template(tok) -> Optional[str]:
    """A chat template that renders a conversation ending in an assistant turn as the trained layout,
    `[BOS] <the original template over the prompt, with the generation prompt> response [EOS]` (pair_tokenization),
    and every other conversation exactly as before (what `render_prompt` reads). None when BOS/EOS cannot be
    written as text. The original template runs unchanged inside a macro (its own variables, `bos_token`, ...)."""
    from datamodules.preference.pair_tokenization import PairTokenizer

    pt = PairTokenizer(tok, max_length=64)
    prefix, suffix = tok.decode(pt.prefix), tok.decode(pt.suffix)
    if any(c in t for t in (prefix, suffix) for c in "'\\{}%#"):
        return None
    prompt = tok.chat_template or PLAIN_PROMPT
    return ("{% macro shiftgen_prompt(messages, add_generation_prompt) %}" + prompt + "{% endmacro %}"
            "{%- if messages and messages[-1]['role'] == 'assistant' -%}"
            "{%- set p = shiftgen_prompt(messages[:-1], true) -%}"
            f"{{%- if '{prefix}' and not p.startswith('{prefix}') -%}}{prefix}{{%- endif -%}}"
            f"{{{{- p -}}}}{{{{- messages[-1]['content'] -}}}}{suffix}"
            "{%- else -%}{{- shiftgen_prompt(messages, add_generation_prompt) -}}{%- endif -%}")


def conversation(pair: dict, key: str) -> list[dict]:
    """A TRL-style conversation: the prompt's messages + the response as the assistant's turn."""
    return list(pair["prompt"]) + [{"role": "assistant", "content": pair[key]}]


def give_conversation_template(tok, pairs: list[dict]) -> dict:
    """Install `conversation_template` when it reproduces our ids on every probe pair (chosen and rejected):
    `apply_chat_template(conversation)` and, on its text, `tokenizer(text)` (the text-classification pipeline's
    call; `add_special_tokens=False` when the tokenizer would add BOS again). Returns what the card states."""
    from datamodules.preference.pair_tokenization import PairTokenizer, render_prompt

    template = conversation_template(tok)
    if template is None:
        return {"conversation": False, "conversation_why": "its BOS/EOS cannot be written into a chat template"}
    want = PairTokenizer(tok, max_length=10**6)({k: [p[k] for p in pairs] for k in ("prompt", "chosen", "rejected")})
    prompts = [render_prompt(tok, p["prompt"]) for p in pairs]
    original = tok.chat_template
    tok.chat_template = template
    if [render_prompt(tok, p["prompt"]) for p in pairs] != prompts:  # prompts alone render as they did in training
        tok.chat_template = original
        return {"conversation": False, "conversation_why": "the wrapped template renders prompts differently"}
    facts = {"conversation": True, "conversation_checked": 2 * len(pairs), "pipeline_kwargs": {}}
    for i, pair in enumerate(pairs):
        for key, ids in (("chosen", want["a_input_ids"][i]), ("rejected", want["b_input_ids"][i])):
            got = tok.apply_chat_template(conversation(pair, key), tokenize=True, return_dict=True)["input_ids"]
            text = tok.apply_chat_template(conversation(pair, key), tokenize=False)
            if list(got) != ids:
                tok.chat_template = original
                return {"conversation": False, "conversation_why": (
                    f"`apply_chat_template` over a probe conversation (response {pair[key][:40]!r}) does not give the "
                    "trained ids")}
            if tok(text)["input_ids"] != ids:
                facts["pipeline_kwargs"] = {"add_special_tokens": False}
                if tok(text, add_special_tokens=False)["input_ids"] != ids:
                    tok.chat_template = original
                    return {"conversation": False, "conversation_why": "the tokenizer does not encode the rendered "
                                                                       "text back to the same ids"}
    return facts


def conversation_probe_pairs() -> list[dict]:
    """Conversations in the fixtures' shapes: one and several turns, a system turn, punctuation at the boundary."""
    ask = [{"role": "user", "content": "How do I boil an egg?"}]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one, please!"}]
    return [{"prompt": ask, "chosen": "Simmer it for nine minutes.", "rejected": "Eggs are round."},
            {"prompt": chat, "chosen": "Green.", "rejected": "I will not say."},
            {"prompt": ask, "chosen": "(1) Boil water; (2) add the egg.", "rejected": "Ok"}]


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
    facts.update(give_conversation_template(tok, conversation_probe_pairs()))
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


REMOTE_CODE = "modeling_shiftgen_reward.py"


def write_pooled_reward(module, tok, tmp: str) -> dict:
    """The backbone + our head as `PooledRewardModel` (modeling_shiftgen_reward.py, copied beside the weights):
    `AutoModelForSequenceClassification.from_pretrained(D, trust_remote_code=True)` scores like the module, and
    without `trust_remote_code=True` it raises (a model type transformers does not know) instead of loading a
    random head."""
    from safetensors.torch import save_file

    from lightning_modules.export.modeling_shiftgen_reward import PooledRewardConfig

    backbone = module.backbone
    base = backbone.merge_and_unload() if hasattr(backbone, "peft_config") else backbone
    base.config.pad_token_id = tok.pad_token_id
    name = REMOTE_CODE[:-3]
    config = PooledRewardConfig(backbone_config=base.config.to_dict(), pooling=module.head.pooling, num_labels=1,
                                id2label={0: "reward"}, label2id={"reward": 0}, pad_token_id=tok.pad_token_id,
                                architectures=["PooledRewardModel"],
                                auto_map={"AutoConfig": f"{name}.PooledRewardConfig",
                                          "AutoModelForSequenceClassification": f"{name}.PooledRewardModel"})
    config.save_pretrained(tmp)
    tensors = {f"backbone.{k}": v.detach().contiguous().clone() for k, v in base.state_dict().items()}
    tensors["score.weight"] = module.head.score.weight.detach().contiguous().clone()
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), REMOTE_CODE), os.path.join(tmp, REMOTE_CODE))
    tok.save_pretrained(tmp)
    return {"kind": f"PooledRewardModel ({type(base).__name__} + {module.head.pooling} pooling + linear head; "
                    "AutoModelForSequenceClassification with trust_remote_code=True)",
            "adapter_base": None, "absolute_positions": _absolute_positions(base), "remote_code": True}


def refuses_without_remote_code(directory: str) -> str:
    """The plain load paths must raise, never build a random head: returns transformers' message."""
    import transformers.dynamic_module_utils as dynamic
    from transformers import AutoModelForSequenceClassification

    messages, timeout = [], dynamic.TIME_OUT_REMOTE_CODE
    for kwargs in ({}, {"num_labels": 1}):
        dynamic.TIME_OUT_REMOTE_CODE = 0  # transformers would otherwise ask on a terminal (what a user sees) here
        try:
            AutoModelForSequenceClassification.from_pretrained(directory, **kwargs)
        except ValueError as err:
            messages.append(str(err))
            continue
        finally:
            dynamic.TIME_OUT_REMOTE_CODE = timeout
        raise ExportError(f"AutoModelForSequenceClassification.from_pretrained(D{', num_labels=1' if kwargs else ''}) "
                          "loaded the export without its pooling code (a random head); nothing was written")
    return messages[0].splitlines()[0]


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
    conversations_expected = conversation_expectations(module, tok)
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
            facts = write_pooled_reward(module, tok, tmp)
            facts["refusal"] = refuses_without_remote_code(tmp)
            tok_class = tokenizer_class_that_loads(tok, tmp, remote_code=True)
            code = classifier_code(final_dir, None, tok.pad_token_id, tok_class, remote_code=True)
            check_code = classifier_code(tmp, None, tok.pad_token_id, tok_class, remote_code=True)
        check_dir = tmp
        code, check_code = code + "\n\n" + input_code(tok), check_code + "\n\n" + input_code(tok)
        loaded = run_loader(check_code)
        new_pad = loaded["tok"].pad_token_id
        with torch.no_grad():
            got = {s: loaded["score_ids"](*pad_rows(rows, new_pad, s)) for s in ("right", "left")}
        worst = compare(expected, got, dtype)
        if facts.get("conversation"):
            worst = max(worst, check_conversations(conversations_expected, check_dir, loaded, tok_class, facts,
                                                   dtype))
        from datamodules.preference.pair_tokenization import is_encoder_tokenizer

        if facts.get("remote_code") and is_encoder_tokenizer(tok):
            worst = max(worst, check_pair_pipeline(conversations_expected, tok, check_dir, dtype))
            facts["pair_pipeline"] = True
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


@torch.no_grad()
def conversation_expectations(module, tok) -> tuple[list[list[int]], torch.Tensor]:
    """Our ids and the module's rewards of the probe conversations (chosen, rejected per pair), unpadded. Taken
    before anything is written: a `--lora_only` export unloads the adapters from the module."""
    from datamodules.preference.pair_tokenization import PairTokenizer

    pairs = conversation_probe_pairs()
    enc = PairTokenizer(tok, max_length=10**6)({k: [p[k] for p in pairs] for k in ("prompt", "chosen", "rejected")})
    rows = [r for ab in zip(enc["a_input_ids"], enc["b_input_ids"]) for r in ab]
    return rows, torch.cat([module(*pad_rows([r], tok.pad_token_id, "right"))[0].float() for r in rows])  # (2P,)


@torch.no_grad()
def check_conversations(expectations: tuple, directory: str, loaded: dict, tok_class: str, facts: dict,
                        dtype: torch.dtype) -> float:
    """The TRL-style paths on the written directory score the probe conversations like the module:
    `apply_chat_template(conversation)` into the card's model, and `pipeline("text-classification")` on the
    rendered text (merged exports; an adapter needs its base first)."""
    rows, want = expectations
    convs = [conversation(p, k) for p in conversation_probe_pairs() for k in ("chosen", "rejected")]
    ltok = loaded["tok"]
    ids = [ltok.apply_chat_template(c, tokenize=True, return_dict=True)["input_ids"] for c in convs]
    if [list(i) for i in ids] != rows:
        raise ExportError("the exported tokenizer's chat template, loaded back, does not give the trained layout")
    got = {"chat": torch.cat([loaded["score_ids"](*pad_rows([list(i)], ltok.pad_token_id, "right")) for i in ids])}
    if facts["adapter_base"] is None:
        from transformers import pipeline

        kwargs = {} if tok_class == "AutoTokenizer" else {"tokenizer": ltok}
        classify = pipeline("text-classification", model=directory, function_to_apply="none", **kwargs)
        texts = [ltok.apply_chat_template(c, tokenize=False) for c in convs]
        out = classify(texts, **facts["pipeline_kwargs"])
        got["pipeline"] = torch.tensor([o["score"] for o in out])
    return compare({k: want for k in got}, got, dtype)


def conversation_usage(facts: dict) -> str:
    """The card's paragraph on TRL-style conversations (decoder exports) or on the pipeline (pooled exports)."""
    if facts.get("pair_pipeline"):
        return ("\n\nThe text-classification pipeline takes the same flag; an encoder's input is the pair "
                "`{\"text\": prompt, \"text_pair\": response}` with the prompt as `reward_input` writes it "
                "(`role: content` lines):\n\n```python\nfrom transformers import pipeline\n\n"
                "classify = pipeline(\"text-classification\", model=D, trust_remote_code=True, function_to_apply=\"none\")\n"
                "print(classify({\"text\": \"user: How do I boil an egg?\", \"text_pair\": \"Simmer it for nine minutes.\"})"
                "[\"score\"])\n```")
    if "conversation" not in facts:
        return ""  # a decoder with mean pooling: `reward_input` / `rewards` above
    if not facts["conversation"]:
        return (f"\n\n**TRL-style conversations:** not supported by this export ({facts['conversation_why']}): "
                "`tok.apply_chat_template(prompt + [assistant turn])` does not give the layout above and scores "
                "differently. Score with `reward_input` / `rewards`.")
    tokenizer = "" if facts.get("tokenizer_class", "AutoTokenizer") == "AutoTokenizer" else ", tokenizer=tok"
    kwargs = "".join(f", {k}={v!r}" for k, v in facts["pipeline_kwargs"].items())
    return f'''

**TRL-style conversations score the same.** The exported tokenizer's chat template renders a conversation that ends
in an assistant turn (the prompt's messages + the response, as TRL's reward datasets hold them) as exactly the layout
above, `[BOS] chat-template(prompt, add_generation_prompt=True) response [EOS]`, instead of the original template's
rendering of the whole conversation (ChatML, for one, would close the turn with `<|im_end|>` and a newline and so
score another token). Conversations without a final assistant turn render as before. Checked at export on
{facts['conversation_checked']} conversations, through both calls below:

```python
from transformers import pipeline

conversation = [{{"role": "user", "content": "How do I boil an egg?"}},
                {{"role": "assistant", "content": "Simmer it for nine minutes."}}]
ids = tok.apply_chat_template(conversation, return_dict=True, return_tensors="pt")
print(rm(**ids).logits[0, 0])
classify = pipeline("text-classification", model=D, function_to_apply="none"{tokenizer})
print(classify(tok.apply_chat_template(conversation, tokenize=False){kwargs})[0]["score"])
```

What still differs from training: nothing is truncated (training cut prompts longer than `max_length` from the
left), and the rendered text is tokenized as one string where training tokenized prompt and response apart: a
response whose first characters merge with the prompt's last token (under byte-level BPE, one starting with
whitespace) can get other ids. `reward_input` is exact in every case.'''


@torch.no_grad()
def check_pair_pipeline(expectations: tuple, tok, directory: str, dtype: torch.dtype) -> float:
    """An encoder export through `pipeline("text-classification", trust_remote_code=True)` on text pairs
    (prompt as `render_prompt` writes it, response) scores the probe conversations like the module."""
    from transformers import pipeline

    from datamodules.preference.pair_tokenization import render_prompt

    pairs, want = conversation_probe_pairs(), expectations[1]
    classify = pipeline("text-classification", model=directory, trust_remote_code=True, function_to_apply="none")
    inputs = [{"text": render_prompt(tok, p["prompt"]), "text_pair": p[k]} for p in pairs for k in ("chosen", "rejected")]
    got = torch.tensor([classify(x)["score"] for x in inputs])
    return compare({"pipeline": want}, {"pipeline": got}, dtype)


def reward_card(prov: dict, facts: dict, code: str) -> str:
    adapter = facts["adapter_base"] is not None
    summary = (f"A scalar reward model r(prompt, response) trained with the shiftgen codebase, exported as "
               f"**{facts['kind']}**. Higher is better; compare rewards of responses to the same prompt.")
    if facts.get("remote_code"):
        summary += ("\n\n**Load it with `trust_remote_code=True`.** No transformers class pools like this model (an "
                    "encoder or mean pooling: `BertForSequenceClassification`, for one, scores the pooler's [CLS] "
                    "vector), so the pooling and the trained head are defined in `modeling_shiftgen_reward.py` beside "
                    "the weights (torch and transformers only; read it first). Without the flag, "
                    "`AutoModelForSequenceClassification.from_pretrained(D)` (with or without `num_labels=1`) raises "
                    "— or, on a terminal, asks whether to run that code — and never loads a random head; the export "
                    f"checked it: \"{facts['refusal']}\"")
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
    usage += conversation_usage(facts)
    check = (f"Loaded back with the code above and scored against the training module on probe sequences, right "
             f"and left padded" + (f", and on {facts['conversation_checked']} conversations through "
                                  "`apply_chat_template` and the text-classification pipeline" if facts.get("conversation")
                                  else "") + f": max |Δ reward| = {facts['max_abs_diff']:.2e} ({facts['dtype']}).")
    front = {"library_name": "peft" if adapter else "transformers", "pipeline_tag": "text-classification",
             "tags": ["reward-model", "shiftgen"]}
    return render_card("Reward model (shiftgen export)", front, summary, usage, prov, check)
