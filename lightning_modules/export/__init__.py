"""Hugging Face interchange (docs/export.md): our checkpoints out as standard `transformers` directories
(`python cli.py export`), outside reward models in as `--model.backbone hf_classifier:<dir or hub id>`.

Kept free of heavy imports: `reward_model.py` imports `hf_classifier` from here.
"""
