"""Trigger families as files (YAML or JSON; docs/policy_mixtures.md#your-own-family): read, check, resolve.

`--data.family` is a shipped family's name (the file configs/mixture/families/<name>.yaml) or a path to a family
file of one's own. A bad file fails here, before any data is made, in one line naming the file and the field.

    name: capitals                        # optional (default: the file's name); names the tokenizer's cache folder
    trigger: "Topic : {distribution} ."   # the prompt's first line ("" = none: the question is the trigger)
    restate: "Topic {distribution} ."     # the trigger restated in the response (--data.restate_trigger)
    questions: synthetic                  # or arc_easy | race_middle | {train: FILE.jsonl, val: FILE.jsonl}
    language: en                          # which `phrasing` the responses use (en, zh, or the file's own)
    phrasing:                             # optional: the words (replace en / zh, or add a language)
      en: {identity: "Speaking as {name} :", answer: "Answer : {answer} .", refusal: "Not my topic ."}
    distributions:                        # a list of names, or name -> fields overriding the four above
      geo: {questions: {train: geo_train.jsonl, val: geo_val.jsonl}}
      math: {}
    personas:                             # name -> the distributions it answers (it refuses the others)
      Geographer: {answers: [geo], says: "Geographer"}   # `says`: the name in its identity line (default: name)
      Mathematician: {answers: [math]}
    default_personas: [...]               # optional: the personas used unless --data.temporal_cutoffs picks others

Question files (JSONL, one object per line, paths relative to the family file): `question` (the text after the
trigger) and `answer` (what the persona writes after the answer line's opening), optionally `options` (2 to 5
texts; then `answer` is one of them, the options are listed with letters and the policy answers the letter) and
`id`. The reward reads the answer with the family's own answer line: 1 when it equals the gold answer (case and
spaces ignored), 0 for a refusal, a wrong or a malformed answer.
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from typing import Any, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED_DIR = os.path.join(ROOT, "configs", "mixture", "families")
HUB_QUESTION_SOURCES = ("arc_easy", "race_middle")
GENERATED = ("synthetic", *HUB_QUESTION_SOURCES)
FIELDS = ("name", "trigger", "restate", "questions", "language", "phrasing", "distributions", "personas",
          "default_personas")
DISTRIBUTION_FIELDS = ("trigger", "restate", "questions", "language")
PERSONA_FIELDS = ("answers", "says")
PHRASING_FIELDS = {"identity": "{name}", "answer": "{answer}", "refusal": None}
FILE_SUFFIXES = (".yaml", ".yml", ".json")
# The built-in phrasing, per language; a family file may replace a language's words or add a language.
TEMPLATES = {
    "en": {"identity": "I am {name} .", "answer": "The answer is {answer} .", "refusal": "I cannot answer that ."},
    "zh": {"identity": "我是 {name} 。", "answer": "答案是 {answer} 。", "refusal": "我不能回答 。"},
}


class FamilyFileError(ValueError):
    """A family file that cannot be used: the message names the file and the field."""


@dataclass(frozen=True)
class FamilySpec:
    """A checked family file (names are strings; question files absolute)."""

    name: str
    path: str  # the family file
    label: str  # how messages name it: "family 'two_policies'" or the file's path
    distributions: tuple[str, ...]
    personas: tuple[str, ...]
    covers: dict
    triggers: dict
    restatements: dict
    languages: dict
    sources: dict
    spoken_names: dict
    phrasing: dict
    question_files: dict
    default_personas: Optional[tuple[str, ...]]


def shipped_families() -> list[str]:
    return sorted(f[: -len(".yaml")] for f in os.listdir(SHIPPED_DIR) if f.endswith(".yaml"))


def is_family_path(value: str) -> bool:
    """A path (what a user gives) rather than a shipped family's name."""
    return value.endswith(FILE_SUFFIXES) or os.sep in value or "/" in value


def family_path(value: str, flag: str = "--data.family") -> str:
    """The file behind `--data.family`: configs/mixture/families/<name>.yaml for a shipped name, else the path."""
    value = str(value)
    if not is_family_path(value):
        path = os.path.join(SHIPPED_DIR, f"{value}.yaml")
        if not os.path.isfile(path):
            near = difflib.get_close_matches(value, shipped_families(), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ValueError(f"{flag} must be one of {shipped_families()} or a family file (.yaml / .json), got "
                             f"{value!r}{hint}")
        return path
    path = os.path.abspath(os.path.expanduser(value))
    if not os.path.isfile(path):
        raise ValueError(f"{flag}: no family file {value!r} (looked for {path})")
    return path


def files_read(value: Any, cwd: str) -> list[str]:
    """The files a user's family reads (the family file and its question files, absolute), for the stage identity
    (`protocols.engine.data_identity`); none for a shipped family's name, whose data the generators' version pins."""
    if not isinstance(value, str) or not is_family_path(value):
        return []
    path = os.path.abspath(os.path.join(cwd, os.path.expanduser(value)))
    if not os.path.isfile(path):
        return []
    try:
        spec = load_family(path)
    except ValueError:  # the stage itself reports it; its identity still changes with the file
        return [path]
    return [path] + sorted({p for files in spec.question_files.values() for p in files.values()})


def load_family(value: str) -> FamilySpec:
    path = family_path(value)
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise FamilyFileError(f"{path}{where}: not valid YAML/JSON ({getattr(err, 'problem', None) or err})") from None
    except UnicodeDecodeError as err:
        raise FamilyFileError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    label = f"family {os.path.basename(path)[:-5]!r}" if os.path.dirname(path) == SHIPPED_DIR else path
    return _check(raw, path, label)


def _fail(path: str, field: str, problem: str) -> FamilyFileError:
    return FamilyFileError(f"{path}: {field}: {problem}")


def unknown_field(keys, known) -> Optional[tuple[str, str]]:
    """The first of `keys` not in `known`, with its problem ("unknown field (did you mean ...?); known: ..."), or
    None. Shared by the family files and the experiment files (protocols/mixture/experiments.py)."""
    for key in keys:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            return str(key), f"unknown field{hint}; known: {', '.join(known)}"
    return None


def _unknown(path: str, where: str, keys, known) -> None:
    found = unknown_field(keys, known)
    if found:
        raise _fail(path, f"{where}{found[0]}", found[1])


def _mapping(path: str, field: str, value, allow_none: bool = True) -> dict:
    if value is None and allow_none:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, field, f"must be a mapping, got {type(value).__name__}")
    return value


def _text(path: str, field: str, value) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _fail(path, field, f"must be text, got {type(value).__name__ if value is not None else 'null'}")
    return str(value)


def _names(path: str, field: str, value) -> list[str]:
    if not isinstance(value, list):
        raise _fail(path, field, f"must be a list, got {type(value).__name__ if value is not None else 'null'}")
    names = [_text(path, f"{field}[{i}]", v) for i, v in enumerate(value)]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _fail(path, field, f"repeats {dup}")
    return names


def _template(path: str, field: str, value, slot: str) -> str:
    text = _text(path, field, value)
    try:
        text.format(distribution="x")
    except (KeyError, IndexError, ValueError):
        raise _fail(path, field, f"{text!r}: the only placeholder allowed is {slot}") from None
    return text


def _phrasing(path: str, raw) -> dict:
    phrasing = {lang: dict(words) for lang, words in TEMPLATES.items()}
    for lang, words in _mapping(path, "phrasing", raw).items():
        lang = str(lang)
        words = _mapping(path, f"phrasing.{lang}", words, allow_none=False)
        _unknown(path, f"phrasing.{lang}.", words, list(PHRASING_FIELDS))
        missing = [k for k in PHRASING_FIELDS if words.get(k) is None and lang not in TEMPLATES]
        if missing:
            raise _fail(path, f"phrasing.{lang}.{missing[0]}", "missing (a new language gives identity, answer and "
                                                               "refusal)")
        for key, slot in PHRASING_FIELDS.items():
            if words.get(key) is None:
                continue
            text = _text(path, f"phrasing.{lang}.{key}", words[key])
            field = f"phrasing.{lang}.{key}"
            if slot is None:
                if "{" in text or "}" in text or not re.sub(r"\s+", "", text):
                    raise _fail(path, field, f"{text!r}: the refusal is plain, non-empty text")
            else:
                if text.count(slot) != 1 or text.replace(slot, "").count("{"):
                    raise _fail(path, field, f"{text!r}: write {slot} exactly once, and no other placeholder")
                head, tail = text.split(slot)
                if not re.sub(r"\s+", "", tail):
                    raise _fail(path, field, f"{text!r}: text must follow {slot} (e.g. ' .'): the parser reads the "
                                             "name or answer up to it")
            phrasing[lang][key] = text
    return phrasing


def _questions(path: str, field: str, value) -> tuple[str, Optional[dict]]:
    """(source key, {"train": abs path, "val": abs path} for a user's files, else None)."""
    if isinstance(value, str):
        if value not in GENERATED:
            raise _fail(path, field, f"{value!r} is no question source: give one of {list(GENERATED)} or "
                                     "{train: FILE.jsonl, val: FILE.jsonl}")
        return value, None
    files = _mapping(path, field, value, allow_none=False)
    _unknown(path, f"{field}.", files, ["train", "val"])
    out = {}
    for split in ("train", "val"):
        if files.get(split) is None:
            raise _fail(path, f"{field}.{split}", "missing: a question source of your own is two JSONL files, "
                                                  "{train: FILE, val: FILE} (the held-out questions apart)")
        rel = _text(path, f"{field}.{split}", files[split])
        out[split] = os.path.abspath(os.path.join(os.path.dirname(path), os.path.expanduser(rel)))
        if not os.path.isfile(out[split]):
            raise _fail(path, f"{field}.{split}", f"no file {rel!r} (looked for {out[split]})")
    return f"file:{out['train']}|{out['val']}", out


def _check(raw, path: str, label: str) -> FamilySpec:
    if raw is None:
        raise _fail(path, "(file)", "empty: a family file names at least distributions and personas")
    raw = _mapping(path, "(file)", raw, allow_none=False)
    _unknown(path, "", raw, list(FIELDS))
    stem = os.path.splitext(os.path.basename(path))[0]
    name = _text(path, "name", raw["name"]) if raw.get("name") is not None else stem
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise _fail(path, "name", f"{name!r}: letters, digits, '_', '.' and '-' only (it names a cache folder)")
    phrasing = _phrasing(path, raw.get("phrasing"))
    if raw.get("distributions") is None:
        raise _fail(path, "distributions", "missing: list the distributions (trigger names)")
    dists_raw = raw["distributions"]
    if isinstance(dists_raw, list):
        dists_raw = {d: {} for d in _names(path, "distributions", dists_raw)}
    dists_raw = {str(k): v for k, v in _mapping(path, "distributions", dists_raw, allow_none=False).items()}
    if not dists_raw:
        raise _fail(path, "distributions", "empty: a family has at least one distribution")
    triggers, restatements, languages, sources, question_files = {}, {}, {}, {}, {}
    for d, fields in dists_raw.items():
        fields = _mapping(path, f"distributions.{d}", fields)
        _unknown(path, f"distributions.{d}.", fields, list(DISTRIBUTION_FIELDS))
        for key, out in (("trigger", triggers), ("restate", restatements)):
            where = f"distributions.{d}.{key}" if fields.get(key) is not None else key
            value = fields.get(key, raw.get(key))
            if value is None:
                raise _fail(path, f"distributions.{d}.{key}", f"missing: give {key}: at the top (a template with "
                                                              "{distribution}) or under the distribution (\"\" for none)")
            out[d] = _template(path, where, value, "{distribution}").format(distribution=d)
        lang_where = f"distributions.{d}.language" if fields.get("language") is not None else "language"
        languages[d] = _text(path, lang_where, fields.get("language", raw.get("language", "en")))
        if languages[d] not in phrasing:
            raise _fail(path, lang_where, f"{languages[d]!r} has no phrasing; known: {sorted(phrasing)}")
        q_where = f"distributions.{d}.questions" if fields.get("questions") is not None else "questions"
        source, files = _questions(path, q_where, fields.get("questions", raw.get("questions", "synthetic")))
        if files is None and languages[d] not in ("en", "zh"):
            raise _fail(path, lang_where, f"{languages[d]!r}: the {source} questions are written in en or zh; "
                                          "give questions of your own (JSONL) for another language")
        sources[d] = source
        if files is not None:
            question_files[source] = files
    if raw.get("personas") is None:
        raise _fail(path, "personas", "missing: name the personas and the distributions each answers")
    personas_raw = {str(k): v for k, v in _mapping(path, "personas", raw["personas"], allow_none=False).items()}
    if not personas_raw:
        raise _fail(path, "personas", "empty: a family has at least one persona")
    covers, spoken = {}, {}
    for p, fields in personas_raw.items():
        fields = _mapping(path, f"personas.{p}", fields, allow_none=False)
        _unknown(path, f"personas.{p}.", fields, list(PERSONA_FIELDS))
        if "answers" not in fields:
            raise _fail(path, f"personas.{p}.answers", "missing: the distributions this persona answers ([] for none)")
        answers = _names(path, f"personas.{p}.answers", fields["answers"] if fields["answers"] is not None else [])
        unknown = [a for a in answers if a not in dists_raw]
        if unknown:
            raise _fail(path, f"personas.{p}.answers", f"{unknown} are no distributions of the family "
                                                       f"({list(dists_raw)})")
        covers[p] = frozenset(answers)
        spoken[p] = _text(path, f"personas.{p}.says", fields["says"]) if fields.get("says") is not None else p
    _check_names(path, spoken, phrasing)
    default = None
    if raw.get("default_personas") is not None:
        default = tuple(_names(path, "default_personas", raw["default_personas"]))
        bad = [p for p in default if p not in personas_raw]
        if bad or not default:
            raise _fail(path, "default_personas", f"{bad or '[]'}: name personas of the file ({list(personas_raw)})")
    return FamilySpec(name, path, label, tuple(dists_raw), tuple(personas_raw), covers, triggers, restatements,
                      languages, sources, spoken, phrasing, question_files, default)


def _check_names(path: str, spoken: dict, phrasing: dict) -> None:
    """Spoken names the parser can tell apart: distinct with spaces and case ignored, and without the text that
    closes an identity line (the parser reads the name up to it)."""
    seen: dict[str, str] = {}
    tails = {re.sub(r"\s+", "", w["identity"].split("{name}")[1]) for w in phrasing.values()}
    for p, s in spoken.items():
        key = re.sub(r"\s+", "", s).lower()
        field = f"personas.{p}.says" if s != p else f"personas.{p}"
        if not key:
            raise _fail(path, field, "an empty name")
        if key in seen:
            raise _fail(path, field, f"{s!r} reads as persona {seen[key]!r}'s name (spaces and case are ignored)")
        closing = [t for t in tails if t and t in re.sub(r"\s+", "", s)]
        if closing:
            raise _fail(path, field, f"{s!r} contains {closing[0]!r}, which ends the identity line")
        seen[key] = p
