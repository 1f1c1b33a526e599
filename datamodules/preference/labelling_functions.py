"""Labelling functions as W2S teachers: `labeller:<name>[:key=value,...]` wherever a teacher checkpoint goes
(`--data.teacher_checkpoint`, the protocol's `teacher_labeller`; docs/vader_icwsm.md, docs/w2s.md).

A labelling function gives each response a score s; a pair's margin is (s_a − s_b) / T and its soft label
q = σ(margin), the same file format as a trained teacher's (`weak_labels.write_weak_labels`: the student half's labels
on the seeded (a, b) order, the margins on every test split and on the validation split), so a labeller is scored on
exactly the students' pairs. No model is loaded: the data layer computes it itself.

    labeller:vader_lexicon                the VADER lexicon's compound score of the response (vaderSentiment 3.3.2,
                                          rule-based, any text); T = 0.25 by default (compound is in [-1, 1])
    labeller:one_rater                    one human rater's score of each text (VADER ICWSM sources only): the k-th
    labeller:one_rater:rater=3            score listed for the text (k = `rater`, default 0; the lists are anonymised,
                                          so position k is not one person across texts); T = 1 (scores are -4..4)
    labeller:vader_lexicon:temperature=0.5    any labeller: T

A tie (equal scores) gives margin 0 and q = 0.5; it counts as wrong in every accuracy (`val/acc`'s rule).
"""
from __future__ import annotations

from typing import Callable, Optional

PREFIX = "labeller:"
VERSION = 1  # bump when a labeller's scores change: it keys the cached label files


def is_labeller(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


class LabellingFunction:
    """A per-response score; subclasses set `name`, `default_temperature` and implement `scores`."""

    name: str = ""
    default_temperature: float = 1.0
    options: tuple[str, ...] = ()

    def __init__(self, temperature: Optional[float] = None, **options: str):
        self.temperature = self.default_temperature if temperature is None else float(temperature)
        if not self.temperature > 0:
            raise ValueError(f"labeller {self.name}: temperature must be > 0, got {temperature!r}")

    def scores(self, records: list[dict], resolve_source: Callable[[str], object]) -> list[tuple[float, float]]:
        """(s_chosen, s_rejected) per record. `resolve_source(name)` builds a record's source with the run's options."""
        raise NotImplementedError

    @property
    def version(self) -> str:
        return f"{self.name}:{VERSION}"


class VaderLexicon(LabellingFunction):
    name = "vader_lexicon"
    default_temperature = 0.25

    def __init__(self, temperature: Optional[float] = None):
        super().__init__(temperature)
        try:
            from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
        except ImportError:
            raise ValueError("labeller:vader_lexicon needs the vaderSentiment package: pip install -e . (setup.cfg "
                             "pins vaderSentiment==3.3.2)") from None
        self._analyzer = SentimentIntensityAnalyzer()
        self._cache: dict[str, float] = {}

    def compound(self, text: str) -> float:
        if text not in self._cache:
            self._cache[text] = float(self._analyzer.polarity_scores(text)["compound"])
        return self._cache[text]

    def scores(self, records, resolve_source):
        return [(self.compound(r["chosen"]), self.compound(r["rejected"])) for r in records]

    @property
    def version(self) -> str:
        from importlib.metadata import version

        return f"{self.name}:{VERSION}:vaderSentiment=={version('vaderSentiment')}"


class OneRater(LabellingFunction):
    name = "one_rater"
    default_temperature = 1.0
    options = ("rater",)

    def __init__(self, temperature: Optional[float] = None, rater: str = "0"):
        super().__init__(temperature)
        try:
            self.rater = int(rater)
        except ValueError:
            raise ValueError(f"labeller one_rater: rater must be an integer, got {rater!r}") from None
        if self.rater < 0:
            raise ValueError(f"labeller one_rater: rater must be >= 0, got {self.rater}")

    def scores(self, records, resolve_source):
        out, sources = [], {}
        for r in records:
            if r["source"] not in sources:  # one source (one read of the corpus) per name
                sources[r["source"]] = resolve_source(r["source"])
            source = sources[r["source"]]
            if not hasattr(source, "pair_items"):
                raise ValueError(f"labeller:one_rater reads human ratings, which source {r['source']!r} does not "
                                 "have (only the VADER ICWSM sources: vader_tweets, vader_movies, vader_amazon, "
                                 "vader_nyt)")
            chosen, rejected = source.pair_items(r)
            for item in (chosen, rejected):
                if self.rater >= len(item.ratings):
                    raise ValueError(f"labeller:one_rater: rater {self.rater} is past the {len(item.ratings)} "
                                     f"ratings of text {item.id!r} ({r['source']})")
            out.append((float(chosen.ratings[self.rater]), float(rejected.ratings[self.rater])))
        return out


LABELLERS: dict[str, type[LabellingFunction]] = {c.name: c for c in (VaderLexicon, OneRater)}


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """`labeller:<name>[:key=value,...]` -> (name, options), refused with the known names."""
    body = spec[len(PREFIX):]
    name, _, rest = body.partition(":")
    if name not in LABELLERS:
        raise ValueError(f"unknown labelling function {name!r}; the labellers are "
                         f"{[PREFIX + n for n in LABELLERS]}")
    options = {}
    for part in filter(None, rest.split(",")):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"options are key=value pairs separated by commas, got {part!r}")
        options[key.strip()] = value.strip()
    return name, options


def build_labeller(spec: str, flag: str = "--data.teacher_checkpoint") -> LabellingFunction:
    try:
        name, options = parse_spec(spec)
        temperature = options.pop("temperature", None)
        return LABELLERS[name](temperature=None if temperature is None else float(temperature), **options)
    except TypeError as err:  # an option the labeller does not take
        raise ValueError(f"{flag} {spec!r}: {err}; options: temperature, "
                         f"{', '.join(LABELLERS[parse_spec(spec)[0]].options) or 'no other'}") from None
    except ValueError as err:
        raise ValueError(f"{flag} {spec!r}: {err}") from None


def labeller_key(spec: str) -> str:
    """What keys a labeller's cached label files: its spec and its code's version (and vaderSentiment's)."""
    return f"{spec}@{build_labeller(spec).version}"
