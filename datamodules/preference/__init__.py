"""Preference pairs (Part A): `datamodule.PreferenceDataModule`, the source registry and adapters (`sources/`), the
synthetic preference-shift generator (`synthetic_shift`), tokenization, collation, samplers and weak labels."""
