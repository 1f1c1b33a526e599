"""An outside reward model's name and folder, `hf_classifier:<dir or hub id>` (docs/export.md), checked without
loading it: no torch, no transformers.

The data module names and checks a teacher given as `--data.teacher_checkpoint hf_classifier:<dir>` with these (and
keys its weak-label cache by the folder's files); the model that scores it is built above, in
`lightning_modules/export/hf_classifier.py`, which re-exports them.
"""
from __future__ import annotations

import json
import os

PREFIX = "hf_classifier:"


def is_hf_classifier(backbone: str) -> bool:
    return isinstance(backbone, str) and backbone.startswith(PREFIX)


def classifier_source(backbone: str) -> str:
    """The directory or hub id after the `hf_classifier:` prefix."""
    source = backbone[len(PREFIX):]
    if not source:
        raise ValueError(f"--model.backbone {backbone!r}: give a directory or hub id after {PREFIX!r}")
    return source


def looks_like_path(source: str) -> bool:
    """A local path rather than a hub id ("name" or "owner/name"): absolute, ./ ~ .., more than one "/", or existing."""
    return (os.path.isabs(source) or source.startswith((".", "~")) or source.count("/") > 1
            or os.path.exists(os.path.expanduser(source)))


def canonical_classifier(backbone: str) -> str:
    """`hf_classifier:` + an absolute path for a local directory (one name whatever the working directory), or the
    hub id as given."""
    source = classifier_source(backbone)
    return PREFIX + (os.path.abspath(os.path.expanduser(source)) if looks_like_path(source) else source)


def check_classifier_source(backbone: str, flag: str) -> None:
    """Refuse, naming `flag` and the path, a local directory that cannot hold a sequence classifier (missing, a file,
    no config.json, another architecture, no weights), reading no weights. A hub id is checked when it loads."""
    source = classifier_source(backbone)
    path = os.path.expanduser(source)
    if not looks_like_path(source):
        return
    if not os.path.isdir(path):
        raise ValueError(f"{flag} {backbone!r}: {'is a file, not' if os.path.exists(path) else 'there is no'} "
                         f"directory {path!r} (give the save_pretrained directory of a …ForSequenceClassification)")
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        raise ValueError(f"{flag} {backbone!r}: the folder {path!r} has no config.json (it holds: {_listing(path)}): "
                         "not a transformers model directory (give the save_pretrained directory of a "
                         "…ForSequenceClassification)")
    with open(config) as f:
        architectures = json.load(f).get("architectures") or []
    if architectures and not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise ValueError(f"{flag} {backbone!r}: {path!r} holds a {', '.join(architectures)}, not a sequence "
                         "classification model (…ForSequenceClassification with num_labels=1); an export with mean "
                         "pooling or an encoder is loaded by its model card's code instead (docs/export.md)")
    if not any(f.endswith((".safetensors", ".bin", ".index.json")) for f in os.listdir(path)):
        raise ValueError(f"{flag} {backbone!r}: {path!r} has no weights (*.safetensors / *.bin)")


def _listing(path: str, limit: int = 12) -> str:
    """The folder's entries, sorted, folders with a trailing slash, at most `limit` of them."""
    names = sorted(n + ("/" if os.path.isdir(os.path.join(path, n)) else "") for n in os.listdir(path))
    if not names:
        return "nothing"
    return ", ".join(names[:limit]) + (f", … ({len(names) - limit} more)" if len(names) > limit else "")
