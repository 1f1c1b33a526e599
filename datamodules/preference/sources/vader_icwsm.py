"""The VADER ICWSM-2014 corpus as preference sources, one per domain (docs/vader_icwsm.md):

    vader_tweets   4,200 tweet-like texts          vader_amazon   3,708 sentences of ~300 Amazon reviews
    vader_movies  10,605 movie-review snippets     vader_nyt      5,190 sentences of ~500 NYT editorials

Real texts with real human labels, each rated by about 20 people; a pair asks which of two texts people rate more
positive. A proxy for preference: the judgment is sentiment intensity, not helpfulness. The corpus is installed
into the cache by `make vader` (`datamodules/preference/vader_corpus.py`); pairs and splits follow
`datamodules/preference/vader_pairs.py`. Options (`--data.source_options '{"vader_tweets": {...}}'`): see
`VaderIcwsmSource`.

Record key: the two item ids in string order, `<id>~<id>` (the order says nothing about which is chosen), so the
labelling functions (`datamodules/preference/labelling_functions.py`) find each text's ratings from the record.
"""
from __future__ import annotations

from collections import Counter
from typing import ClassVar, Optional

from datamodules.preference.records import CANONICAL_SPLITS, make_record
from datamodules.preference.sources.base import DataError, PreferenceSource, SourceSplit, register_source
from datamodules.preference.vader_corpus import DOCUMENT_DOMAINS, DOMAINS, CorpusError, Item, read_domain
from datamodules.preference.vader_pairs import DEFAULT_FRACTIONS, check_fractions, check_rule, make_pairs, split_items

DEFAULT_PROMPT = "Which of these is more positive?"
KEY_SEPARATOR = "~"


class VaderIcwsmSource(PreferenceSource):
    """One domain of the corpus; subclasses (registered below) fix `domain`.

    Args:
        local_dir: must stay None: the files come from the installed corpus (or `corpus_dir`).
        corpus_dir: a folder holding the corpus's files (a test fixture, your own copy: read unchecked); None reads
            the installed corpus, checked against its pinned SHA-256.
        pairs: the pair rule: "sorted" (disjoint, item k with item k + N/2 of the split sorted by mean rating),
            "random" (disjoint, a seeded shuffle paired in twos) or "within_document" (every two sentences of one
            review or article: amazon and nyt only).
        min_delta: the smallest gap |Δ mean rating| a pair may have (scale -4 .. +4); equal means are always left out.
        prompt: the user turn of every pair (the schema needs one): it states the task; the same text for all pairs.
        split_fractions: shares of the items (tweets, movies) or of the documents (amazon, nyt) per split.
        split_seed: the seed of the split and of the `random` pairing.
    """

    domain: ClassVar[str]
    category = "vader_icwsm"
    split_map: ClassVar[dict[str, str]] = {s: s for s in CANONICAL_SPLITS}

    def __init__(self, local_dir: Optional[str] = None, corpus_dir: Optional[str] = None, pairs: str = "sorted",
                 min_delta: float = 1.0, prompt: str = DEFAULT_PROMPT, split_fractions: dict = DEFAULT_FRACTIONS,
                 split_seed: int = 0):
        if local_dir is not None:
            raise DataError(f"{self.name} reads the VADER ICWSM corpus, not a local_dir (got {local_dir!r}); give "
                            f"a copy of the corpus as the source option corpus_dir")
        super().__init__(local_dir=None)
        check_rule(pairs, self.domain in DOCUMENT_DOMAINS, min_delta)
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"prompt must be a non-empty string (the user turn of every pair), got {prompt!r}")
        if isinstance(split_seed, bool) or not isinstance(split_seed, int):
            raise ValueError(f"split_seed must be an integer, got {split_seed!r}")
        self.corpus_dir, self.pairs, self.min_delta = corpus_dir, pairs, float(min_delta)
        self.prompt, self.split_fractions = prompt.strip(), check_fractions(dict(split_fractions))
        self.split_seed = split_seed
        self._items: Optional[list[Item]] = None

    def items(self) -> list[Item]:
        """Every rated text of the domain (read once per instance)."""
        if self._items is None:
            try:
                self._items = read_domain(self.domain, self.corpus_dir)
            except CorpusError as err:
                raise DataError(f"{self.name}: {err}") from None
        return self._items

    def split_items(self) -> dict[str, list[Item]]:
        return split_items(self.items(), self.split_fractions, self.split_seed)

    def load(self, split: str) -> SourceSplit:
        if split not in self.split_map:
            raise DataError(f"{self.name} has no {split!r} split (it has {self.available_splits()})")
        dropped: Counter = Counter()
        pairs = make_pairs(self.split_items()[split], self.pairs, self.min_delta, self.split_seed, dropped)
        prompt = [{"role": "user", "content": self.prompt}]
        records = [make_record(self.name, split, pair_key(a.id, b.id), prompt, a.text, b.text) for a, b in pairs]
        origin = (f"VADER ICWSM corpus ({self.corpus_dir or 'installed'}; {self.domain}, pairs={self.pairs}, "
                  f"min_delta={self.min_delta:g}, split_seed={self.split_seed})")
        if not records:
            raise DataError(f"{self.name}: split {split!r} has no pair (dropped: {dict(dropped)}); lower min_delta "
                            "or change split_fractions")
        return SourceSplit(records=records, dropped=dropped, origin=origin)

    def pair_items(self, record: dict) -> tuple[Item, Item]:
        """(chosen item, rejected item) of one of this source's records, from its key and texts."""
        by_id = self._by_id()
        key = record["id"].rsplit("/", 1)[-1]
        ids = key.split(KEY_SEPARATOR)
        if len(ids) != 2 or any(i not in by_id for i in ids):
            raise DataError(f"{self.name}: record {record['id']!r} names no two items of the corpus")
        a, b = (by_id[i] for i in ids)
        if a.text == record["chosen"] and b.text == record["rejected"]:
            return a, b
        if b.text == record["chosen"] and a.text == record["rejected"]:
            return b, a
        raise DataError(f"{self.name}: record {record['id']!r}: its texts are not those of items {ids}")

    def _by_id(self) -> dict[str, Item]:
        if not hasattr(self, "_index"):
            self._index = {it.id: it for it in self.items()}
        return self._index


def pair_key(id_a: str, id_b: str) -> str:
    return KEY_SEPARATOR.join(sorted((id_a, id_b)))


def _register_all() -> list[str]:
    names = []
    for domain in DOMAINS:
        cls_name = f"Vader{domain.title()}Source"
        cls = register_source(type(cls_name, (VaderIcwsmSource,), {"name": f"vader_{domain}", "domain": domain,
                                                                   "__module__": __name__}))
        globals()[cls_name] = cls  # module-level, so instances pickle (dataloader workers)
        names.append(cls.name)
    return names


VADER_SOURCES = _register_all()


def source_for(record_source: str, options: Optional[dict] = None) -> VaderIcwsmSource:
    """The registered VADER source a record came from (its `source` field), built with `options`."""
    from datamodules.preference.sources.base import SOURCES

    cls = SOURCES.get(record_source)
    if cls is None or not issubclass(cls, VaderIcwsmSource):
        raise DataError(f"source {record_source!r} is not a VADER ICWSM domain ({VADER_SOURCES})")
    return cls(**(options or {}))
