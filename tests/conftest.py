"""Test-wide setup: never touch a hub, keep caches in temporary folders, and a small word-level tokenizer."""
import os
import tempfile

# Set before transformers / datasets are imported anywhere: a stray hub id fails at once instead of retrying.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="hf_home_"))
os.environ["SHIFTGEN_CACHE"] = tempfile.mkdtemp(prefix="shiftgen_cache_")

import glob  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # two cores are shared by everything; more threads only add contention here

pytest_plugins = ["tests.slow_record"]  # every slow test that runs appends a row to docs/slow_runs.md

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
HUB_FIXTURES = os.path.join(FIXTURES, "hub")


def _fixture_words() -> set[str]:
    words = {"user", "assistant", "system", ":", "hello", "how", "are", "you", "fine", "good", "bad"}
    for path in glob.glob(os.path.join(HUB_FIXTURES, "**", "*.jsonl"), recursive=True):
        with open(path, encoding="utf-8") as f:
            words.update(re.findall(r"[A-Za-z0-9']+|[^\sA-Za-z0-9']", f.read()))
    return words


@pytest.fixture(scope="session")
def word_tokenizer_dir(tmp_path_factory) -> str:
    """A word-level tokenizer over the fixture texts and the synthetic benchmark's vocabulary."""
    from datamodules.preference.synthetic_shift import synthetic_vocabulary
    from datamodules.tokenizers import build_wordlevel_tokenizer

    out = str(tmp_path_factory.mktemp("tokenizer"))
    build_wordlevel_tokenizer(_fixture_words() | set(synthetic_vocabulary())).save_pretrained(out)
    return out


@pytest.fixture()
def cache_dir(tmp_path) -> str:
    return str(tmp_path / "cache")


@pytest.fixture(autouse=True)
def _fresh_prefix_stores():
    """The shared stores are process-wide (lightning_modules/fast/shared_store.py): no test sees another's."""
    from lightning_modules.fast.shared_store import release_shared_stores

    release_shared_stores()
    yield
    release_shared_stores()
