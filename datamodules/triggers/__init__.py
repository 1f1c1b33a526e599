"""Trigger prompts (Part B): `datamodule.TriggerDataModule`, the trigger families and personas (`families`) and
the question sources (`questions`: synthetic, ARC, RACE)."""
