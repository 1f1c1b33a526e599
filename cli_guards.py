"""Guards of the command line (docs/reward_model.md, "Command line"), used by `cli.ShiftCLI`.

- `--model.objective naive`: a registry name becomes the class path as it is parsed, so the resolved config (and
  `--print_config`, and the run's config.yaml) records the class path.
- `--ckpt_path`: LightningCLI builds the model from the checkpoint's hyperparameters; a value given explicitly (in a
  --config file or a flag) that differs from them is refused before anything is built, naming the keys.
- a mistyped key leads the error with one line naming it and the closest valid key.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import json
import os
import pickle
import re
import sys
import typing

import torch
import yaml
from jsonargparse import ArgumentError, Namespace
from lightning.pytorch.cli import LightningArgumentParser

from command_errors import message_of, parsers_raise
from lightning_modules.reward.objectives import PreferenceObjective, objective_class_path


class ShiftArgumentParser(LightningArgumentParser):
    """LightningCLI's parser; it also takes objective registry names and names a mistyped key first."""

    lead_errors = False  # set on the CLI's own parsers, not on the class parsers jsonargparse nests inside them

    def parse_args(self, args=None, *rest, **kwargs):  # a nested class parser gets `--objective=<value>` here
        if self.lead_errors and isinstance(args, list):
            problem = config_file_problem(args)
            if problem:
                self.error(problem)
        actions = [a for a in self._actions if _takes_objective(a)]
        if actions and args is not None:
            args = [self._objective_arg(arg, actions) for arg in args]
        return super().parse_args(args, *rest, **kwargs)

    def parse_object(self, obj, *rest, **kwargs):  # ... and `{"objective": <value>, ...}` from a config file here
        for action in (a for a in self._actions if _takes_objective(a)):
            if isinstance(obj, (dict, Namespace)) and action.dest in obj:
                obj = obj.clone() if isinstance(obj, Namespace) else dict(obj)
                obj[action.dest] = self._objective_value(obj[action.dest], action)
        return super().parse_object(obj, *rest, **kwargs)

    def _objective_arg(self, arg: str, actions) -> str:
        for action in actions:
            for option in action.option_strings:
                if arg.startswith(option + "="):
                    try:
                        value = yaml.safe_load(arg[len(option) + 1:])
                    except yaml.YAMLError:
                        return arg
                    new = self._objective_value(value, action)
                    return arg if new is value else f"{option}={json.dumps(new)}"
        return arg

    def _objective_value(self, value, action):
        """A registry or class name (no dot) -> the class path; dotted paths are left to jsonargparse."""
        spec = value.get("class_path") if isinstance(value, (dict, Namespace)) else value
        if not isinstance(spec, str) or "." in spec:
            return value
        try:
            path = objective_class_path(spec)
        except ValueError as err:  # in jsonargparse's wording, so that the headline names the flag
            self.error(f'Parser key "{action.dest}": {err}')
        if isinstance(value, str):
            return path
        return {**(value.as_dict() if isinstance(value, Namespace) else value), "class_path": path}

    def error(self, message: str, ex: Exception | None = None):
        headline = getattr(ex, "lead_line", None)  # a parser nested in this one found it already
        if headline is None and message.startswith(UNKNOWN_KEY):  # ... and put it first in the message it raised
            headline = message.splitlines()[0]
        try:
            if headline is None and self.lead_errors:
                headline = error_headline(message, self)
        except Exception:  # noqa: BLE001 -- a convenience: never let it hide the error itself
            headline = None
        if headline and self.exit_on_error and not parsers_raise():
            sys.stderr.write(f"error: {headline}\n")  # before the usage text, which can be a hundred lines
        elif headline:
            message = f"{headline}\n{message}"
        try:
            super().error(message, ex)
        except ArgumentError as err:  # exit_on_error=False: the one line a command prints (command_errors)
            err.lead_line = headline
            raise


UNION_ERROR = "Does not validate against any of the Union subtypes"


def inner_cause(message: str) -> str | None:
    """The error a subclass-mode class raised, from jsonargparse's Union message that wraps it ("Does not validate
    against any of the Union subtypes ... Errors: - <the class's error> - Expected a <class 'NoneType'>"); None when
    `message` is not such a wrapper. The wrapper lists every subtype's failure; the NoneType one says nothing."""
    if UNION_ERROR not in message or "Errors:" not in message:
        return None
    causes, current = [], None
    for line in message.split("Errors:", 1)[1].splitlines():
        if line.startswith("  - "):
            current = [line[4:]]
            causes.append(current)
        elif current is not None and line.startswith("    "):
            current.append(line.strip())
        elif line.strip():  # "Given value type: ...": the list ended
            current = None
    texts = [" ".join(c).strip() for c in causes]
    useful = [t for t in texts if not t.startswith("Expected a <class 'NoneType'>")]
    return useful[0] if useful else None


def checkpoint_disagreements(parser, args, config) -> list[str]:
    """'--model.KEY: checkpoint A, command line B' for each explicitly given value that the checkpoint's
    hyperparameters would silently replace (LightningCLI loads them into the config when ckpt_path is a file)."""
    sub = config.get("subcommand")
    path = config[sub].get("ckpt_path") if sub else None
    if not path or not os.path.isfile(path) or isinstance(args, (dict, Namespace)):
        return []
    hparams = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("hyper_parameters") or {}
    given = parser.parse_args(args, defaults=False)[sub].get("model")  # only what --config files and flags set
    if not hparams or not given:
        return []
    given = given.as_dict() if isinstance(given, Namespace) else given
    # Compare like with like: the checkpoint holds the dump of the fit's config, so dump this run's config.
    used = yaml.safe_load(parser.dump(config, skip_link_targets=False, skip_unset=False))[sub]["model"]
    differing = []
    if hparams.get("_class_path") and given.get("class_path") not in (None, hparams["_class_path"]):
        differing.append(f"--model: checkpoint {hparams['_class_path']}, command line {given['class_path']}")
    for key in _leaves(given.get("init_args", {}) if "class_path" in given else given):
        if key[0] not in hparams:  # not a hyperparameter of the checkpoint (e.g. objective, optimizer)
            continue
        theirs, ours = _at(hparams, key), _at(used.get("init_args", used), key)
        if theirs != ours:
            differing.append(f"--model.{'.'.join(key)}: checkpoint {theirs!r}, command line {ours!r}")
    return differing


CKPT_PATH_WORDS = ("last", "best", "hpc", "registry")  # what Lightning's --ckpt_path takes besides a path


def check_ckpt_path(config) -> None:
    """Refuse a `--ckpt_path` file that is truncated or corrupt (every archive member's CRC-32), or that another
    family of modules wrote (a reward model's given to a policy run or the reverse), naming the flag, the file and
    both classes; a path that does not exist is refused at once. Raises `CheckpointError`; "last" / "best" (and the
other words of CKPT_PATH_WORDS) and remote paths are left to Lightning."""
    from lightning_modules.checkpoint_checks import (
        POLICY_CLASSES, REWARD_CLASSES, CheckpointError, check_kind, verify_archive,
    )

    sub = config.get("subcommand")
    path = config[sub].get("ckpt_path") if sub else None
    if path and not os.path.exists(path) and path not in CKPT_PATH_WORDS and "://" not in path:
        raise CheckpointError(f"--ckpt_path {path!r}: no such file")  # before the Trainer and the data are built
    if not path or not os.path.isfile(path):
        return
    verify_archive(path, "--ckpt_path")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as err:
        raise CheckpointError(f"--ckpt_path {path!r} does not load: {type(err).__name__}: {str(err)[:300]}") from err
    model = config[sub].get("model")
    wanted = str(model.get("class_path") if isinstance(model, (dict, Namespace)) else "").rsplit(".", 1)[-1]
    for family in (POLICY_CLASSES, REWARD_CLASSES):
        if wanted in family:
            check_kind(ckpt, path, f"--ckpt_path (for --model {wanted})", family)


def _leaves(tree: dict, prefix: tuple = ()):
    for key, value in tree.items():
        if isinstance(value, dict) and value:  # lists are compared whole
            yield from _leaves(value, prefix + (key,))
        else:
            yield prefix + (key,)


def _at(tree, key: tuple):
    for part in key:
        if not isinstance(tree, dict) or part not in tree:
            return "(absent)"
        tree = tree[part]
    return tree


def _takes_objective(action) -> bool:
    hint = getattr(action, "_typehint", None)
    return any(inspect.isclass(t) and issubclass(t, PreferenceObjective) for t in (hint, *typing.get_args(hint)))


_PARSER_KEY, _CLASS_PATH = re.compile(r'Parser key "([^"]+)"'), re.compile(r"class_path ?=? ?'([^']+)'")
_REFUSED = re.compile(r"Option '([^']+)' is not accepted|(unknown objective .*)")


def error_headline(message: str, parser) -> str | None:
    """'unknown key K — did you mean V?' (or the unknown objective, with its flag) from jsonargparse's message."""
    top = re.search(r"Subcommand '(\w+)' does not accept option '([^']+)'", message)  # a YAML key
    flag = re.match(r"unrecognized arguments: (?:(\w+) )?--([^\s=]+)", message)  # a flag
    if top or flag:
        sub, key = (top or flag).groups()
        return _suggest(key, *_first_unknown_part(key, _keys_of(parser, sub)))
    stack = []  # nested messages: 'Parser key "model"' > "class_path '...'" > "Option 'x' is not accepted"
    for line in message.splitlines():
        indent = len(line) - len(line.lstrip(" -"))
        stack = [s for s in stack if s[0] < indent]  # (indent, key part, class path)
        stack += [(indent, m[1], None) for m in _PARSER_KEY.finditer(line)]
        stack += [(indent, "init_args", m[1]) for m in _CLASS_PATH.finditer(line)]
        refused = _REFUSED.search(line)
        if refused and refused[2] and stack:  # (without a key yet: a nested parser's line; the whole path is below)
            return f"--{'.'.join(part for _, part, _ in stack if part != 'init_args')}: {refused[2]}"
        if refused and refused[2]:
            continue
        if refused:
            owner = next((cls for _, _, cls in reversed(stack) if cls), None)
            return _suggest(".".join([part for _, part, _ in stack] + [refused[1]]), refused[1], _init_args(owner))
    return None


UNKNOWN_KEY = "unknown key '"


def _suggest(key: str, unknown: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(unknown, valid, n=1)
    return f"{UNKNOWN_KEY}{key}' — " + (f"did you mean '{close[0]}'?" if close else f"valid here: {', '.join(valid[:20])}")


def _first_unknown_part(key: str, valid: list[str]) -> tuple[str, list[str]]:
    """The first part of the dotted `key` that no valid dotted key has at its place, and those that do."""
    parts = key.split(".")
    for depth, part in enumerate(parts):
        there = sorted({v.split(".")[depth] for v in valid
                        if v.split(".")[:depth] == parts[:depth] and v.count(".") >= depth})
        if part not in there:
            return part, there
    return parts[-1], []


def _keys_of(parser, subcommand: str | None) -> list[str]:
    subcommands = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if subcommands is not None and subcommand in subcommands.choices:
        parser = subcommands.choices[subcommand]
    return [a.dest for a in parser._actions if a.dest != argparse.SUPPRESS]


def _init_args(class_path: str | None) -> list[str]:
    if not class_path:
        return []
    module, _, name = class_path.rpartition(".")
    parameters = inspect.signature(getattr(importlib.import_module(module), name)).parameters.values()
    return [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


# ---- one line per failure of `python cli.py` (cli.run, command_errors.run_command) ----------------------------------
def cli_error_line(err: BaseException) -> str | None:
    """The one line for a failure whose message jsonargparse worded for a parser's reader: the mistyped key with
    the closest valid one, or `--data.batch_size: expected int, got 'abc'` out of a nested Union message (None: the
    exception's own message is the line)."""
    lead = getattr(err, "lead_line", None)
    if lead:
        return lead
    message = message_of(err)
    line = inner_cause(message) or parser_error_line(message) or message
    return re.sub(r"^Problem with given class_path '[^']+':\s*", "", line)  # the class is in the flag's name


_NOISE = re.compile(r"(Does not validate against any of the Union subtypes|Subtypes:|Errors:|Given value|"
                    r"Problem with given class_path|Expected a <class 'NoneType'>)")


def parser_error_line(message: str) -> str | None:
    """'--KEY: <the innermost error>' from jsonargparse's nested 'Parser key "K": ...' message; None when it is not
    one. The path is the keys of the nesting, without `init_args` (what a flag spells)."""
    if 'Parser key "' not in message:
        return None
    path: list[tuple[int, str]] = []
    for line in message.splitlines():
        text = line.lstrip(" -")
        indent = len(line) - len(text)
        path = [(i, k) for i, k in path if i < indent]
        key = re.match(r'Parser key "([^"]+)":\s*(.*)', text)
        if key:
            path.append((indent, key[1]))
            text = key[2]
        if not text.strip() or _NOISE.match(text):
            continue
        flag = ".".join(k for _, k in path).replace("init_args.", "").replace(".init_args", "")
        text = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", text.strip())
        text = re.sub(r"^Expected an? (\w+)\. Got value: (.*)$", r"expected \1, got '\2'", text)
        given = re.findall(r"^\s*Given value: (.*)$", message, flags=re.M)
        if re.fullmatch(r"Expected an? \w+", text) and given:  # a Union (int or None): the value is said apart
            text = f"expected {text.split()[-1]}, got '{given[-1]}'"
        return f"--{flag}: {text}" if flag else text
    return None


def config_file_problem(args: list[str]) -> str | None:
    """What is wrong with a `--config FILE` of `args` (missing, empty, not YAML, not a mapping), naming the file and
    the line; None when they all read. A value that is no file is left to jsonargparse (it takes inline YAML)."""
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            path = args[i + 1]
        elif arg.startswith("--config="):
            path = arg[len("--config="):]
        else:
            continue
        if not os.path.exists(path):
            try:
                inline = isinstance(yaml.safe_load(path), dict)  # `--config '{trainer: {max_epochs: 2}}'`
            except yaml.YAMLError:
                inline = False
            if not inline:
                return f"--config {path}: no such file"
            continue
        try:
            with open(path, encoding="utf-8") as f:
                tree = yaml.safe_load(f)
        except (OSError, UnicodeDecodeError) as err:
            return f"--config {path}: cannot be read ({err})"
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            return f"--config {path}: not valid YAML{where}: {problem}"
        if tree is None:
            return (f"--config {path}: the file is empty; a config file holds a YAML mapping such as "
                    "'trainer: {max_epochs: 2}' (python cli.py fit --print_config shows every key)")
        if not isinstance(tree, dict):
            return (f"--config {path}: holds a YAML {type(tree).__name__}, not a mapping of keys such as "
                    "'trainer: {max_epochs: 2}'")
    return None


def run_log_of(err: BaseException) -> str | None:
    """`error.log` in the log folder of the run that raised `err` (its Trainer's `log_dir`, found in the frames the
    exception passed through), or None when no Trainer with a log folder was built."""
    import traceback

    from lightning.pytorch import Trainer

    for frame, _ in reversed(list(traceback.walk_tb(err.__traceback__))):
        trainer = frame.f_locals.get("trainer")
        if isinstance(trainer, Trainer) and trainer.logger is not None:
            folder = trainer.log_dir
            if folder and os.path.isdir(folder) and trainer.is_global_zero:
                return os.path.join(folder, "error.log")
    return None
