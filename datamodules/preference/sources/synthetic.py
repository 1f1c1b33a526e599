"""The synthetic preference-shift benchmark (docs/synthetic_benchmark.md) as registered sources: `synth_<category>_<domain>`.

    helpful:  synth_helpful_cooking (source), synth_helpful_science, synth_helpful_travel, synth_helpful_tech
    harmless: synth_harmless_household (source), synth_harmless_cyber, synth_harmless_finance,
              synth_harmless_medical

All three canonical splits are generated (see `datamodules.preference.synthetic_shift` and docs/synthetic_benchmark.md);
records carry no hidden metadata -- `SyntheticShiftSource.rows(split)` gives it to baselines and analyses.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Iterable, Optional

from datamodules.preference.records import CANONICAL_SPLITS, make_record
from datamodules.preference.sources.base import DataError, PreferenceSource, register_source
from datamodules.preference.synthetic_shift import CATEGORIES, ShiftOptions, generate_domain, has_artifact, source_name


class SyntheticShiftSource(PreferenceSource):
    """One generated domain; subclasses (registered below) fix `category` and `domain`.

    Args:
        local_dir: must stay None: the rows are generated, not read.
        seed: base seed; each (domain, difficulty, split) draws from its own sub-seed.
        n_train: pairs in the train split.
        n_validation: pairs in the validation split.
        n_test: pairs in the test split.
        difficulty: "easy" or "hard" (paraphrases, on-topic-but-wrong rejections, ambiguous pairs).
        artifact_rate: P(chosen carries the artifact) in [0, 1]; None keeps the domain's default.
        artifacts: False puts the artifact on neither response.
    """

    domain: ClassVar[str]
    split_map: ClassVar[dict[str, str]] = {s: s for s in CANONICAL_SPLITS}

    def __init__(
        self,
        local_dir: Optional[str] = None,
        seed: int = 0,
        n_train: int = 2000,
        n_validation: int = 300,
        n_test: int = 400,
        difficulty: str = "easy",
        artifact_rate: Optional[float] = None,
        artifacts: bool = True,
        **unknown: Any,
    ):
        if local_dir is not None:
            raise DataError(f"{self.name} is generated, not read: it takes no local_dir (got {local_dir!r})")
        if unknown:  # a clear ValueError naming the option, instead of a TypeError from the signature
            ShiftOptions.from_dict(unknown)
        super().__init__(local_dir=None)
        self.options = ShiftOptions(seed=seed, n_train=n_train, n_validation=n_validation, n_test=n_test,
                                    difficulty=difficulty, artifact_rate=artifact_rate, artifacts=artifacts)

    def rows(self, split: str) -> list[dict]:
        """The generated rows with their hidden metadata (artifact placement, topic words, rule case)."""
        if split not in self.split_map:
            raise DataError(f"{self.name} has no {split!r} split (it has {self.available_splits()})")
        return generate_domain(self.category, self.domain, split, **dataclasses.asdict(self.options))

    def artifact_side(self, record: dict) -> Optional[str]:
        """The response of a record that carries the category's artifact ("chosen" / "rejected"), read from the
        text alone; None when neither does (the no-artifact target). For `label_diagnostics`."""
        for side in ("chosen", "rejected"):
            if has_artifact(self.category, record[side]):
                return side
        return None

    def _read_rows(self, split: str) -> tuple[Iterable[dict], str]:
        opts = self.options
        origin = f"synthetic generator ({self.name}, seed={opts.seed}, difficulty={opts.difficulty})"
        return self.rows(split), origin

    def normalize(self, row: dict, key: Any, split: str) -> dict:
        prompt = [{"role": "user", "content": row["prompt"]}]
        return make_record(self.name, split, row["index"], prompt, row["chosen"], row["rejected"])


def _register_all() -> list[str]:
    names = []
    for category, domains in CATEGORIES.items():
        for domain in domains:
            name = source_name(category, domain)
            cls_name = f"Synth{category.title()}{domain.title()}Source"
            attrs = {"name": name, "category": category, "domain": domain, "__module__": __name__}
            cls = register_source(type(cls_name, (SyntheticShiftSource,), attrs))
            globals()[cls_name] = cls  # module-level, so instances pickle (dataloader workers)
            names.append(name)
    return names


SYNTHETIC_SOURCES = _register_all()
