"""Trigger prompts (Part B): `datamodule.TriggerDataModule`, the trigger families and personas (`families`, read from
family files by `family_files`) and the question sources (`questions`: synthetic, ARC, RACE, a family's own files)."""

# The version of what the trigger generators make (transcripts, prompts, questions, vocabulary), part of every
# mixture stage's identity (protocols.engine.data_identity). It was the hash of families.py, questions.py and
# question_fixtures.py when the families moved to files (issue 47.4), so finished runs keep their identities; the
# code may change freely as long as tests/test_trigger_family_files.py finds the shipped families' data unchanged.
# Change it (any new string) together with that test's pin when a change is *meant* to change the generated data.
GENERATOR_VERSION = "cfb9a35730e5fc0309138408e479515c577d125a"
