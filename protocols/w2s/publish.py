"""The W2S protocol's published set (`<out_dir>/<results_name>/`, `protocols.engine.published_set`): claimed before any
work (a set belongs to the configuration that made it), then written from every stage's result as one set."""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict
from typing import Optional

from datamodules.atomic_files import atomic_write_json
from protocols.engine.rank_errors import rank_zero_section
from protocols.engine.run_files import publish_set, read_json
from protocols.w2s.teacher_search import TeacherSearch
from protocols.w2s.config import W2SProtocol
from protocols.w2s.methods import Method, _defaults
from protocols.w2s.stages import Stage, stage_key


def results_dir(p: W2SProtocol) -> str:
    return os.path.join(p.out_dir, p.results_name)


def claim_results(p: W2SProtocol, replace: bool) -> None:
    """Before any work: this configuration's set may be published (`published_set`: a set belongs to the
    configuration that made it). `replace`: withdraw another configuration's set instead of refusing."""
    from protocols.engine.published_set import SET_RECORD, refuse_other_owner, withdraw

    folder = results_dir(p)
    if not os.path.isdir(folder):
        return
    if replace:
        withdraw(folder, read_json(os.path.join(folder, SET_RECORD)), "withdrawn by --replace_results on "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}: another configuration publishes here")
        return
    nested = {"methods": _defaults(Method), "teacher_search": _defaults(TeacherSearch)}
    # Adding methods or seeds grows the same configuration's table; dropping or changing one would lose rows.
    refuse_other_owner(folder, configuration(p), _defaults(W2SProtocol), nested, {"methods": "name", "seeds": None},
                       "--results_name")


RUN_ONLY = {"keep_fit_checkpoints"}  # options of how a run keeps its files, not of what the table shows


def configuration(p: W2SProtocol) -> dict:
    """The configuration a published set records (`protocol.json`) and is owned by: every option but `RUN_ONLY`."""
    return {k: v for k, v in asdict(p).items() if k not in RUN_ONLY}


def publish_results(p: W2SProtocol, stages: list[Stage], done: dict[str, dict[int, dict]],
                    command: Optional[list[str]] = None) -> dict:
    """The table from the finished stages, published (rank 0) as one set: tables, figures, TensorBoard summary and
    HPARAMS tab, the configuration and the stage runs it read (`set.json`), swapped in at once."""
    from protocols.w2s.hparams import write_hparams
    from protocols.engine.published_set import register_readers, remove_stale, stage_entry, write_set_record
    from protocols.w2s.report import result_links, summarize, write_reports

    results = summarize(p, done)
    with rank_zero_section(f"publish the results of {p.out_dir}") as rank0:  # a failure ends every rank at once
        if rank0:
            links = result_links(p.results_name)
            entries = {stage_key(s): stage_entry(p.out_dir, s.result_path, done[s.name][s.seed]) for s in stages}

            def write(folder: str) -> None:
                atomic_write_json(configuration(p), os.path.join(folder, "protocol.json"))
                write_reports(folder, results)
                write_hparams(folder, stages, done, results["id_source"])
                write_set_record(folder, published_command(command), links, entries)

            publish_set(p.out_dir, p.results_name, write, links)
            register_readers(results_dir(p), entries)  # a rerun of any of them, from any folder, withdraws it
            remove_stale(results_dir(p))
            for legacy in ("summary", "hparams"):  # an older layout's TensorBoard folders: now inside results/
                shutil.rmtree(os.path.join(p.out_dir, legacy), ignore_errors=True)
            print(results["markdown"])
    return results


def published_command(args: Optional[list[str]] = None) -> list[str]:
    """The command that published a set, as a person would type it (for a refusal that names the set's owner);
    `args`: the protocol's arguments (default: this process's)."""
    import sys

    return ["python", "-m", "protocols.w2s", *(sys.argv[1:] if args is None else args)]
