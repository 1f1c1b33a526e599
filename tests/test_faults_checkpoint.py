"""Checkpoint files are complete or absent: a SIGKILL during a save, or a full disk, never leaves a truncated file
under a final name (lightning_modules/checkpoint_io.py), a resume never reads one, and the next save removes the
killed writer's temporary file.

The fault cases mount tmpfs file systems (root only; skipped otherwise): TMPDIR on its own file system is what
turned Lightning's default save (a temp file in TMPDIR moved into place) into a copy that a kill could cut.
"""
import contextlib
import errno
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile

import lightning as L
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = os.path.join(ROOT, "configs")
CPU, TINY, SYNTH = (os.path.join(CFG, *p) for p in (("trainer", "cpu.yaml"), ("model", "tiny_teacher.yaml"),
                                                    ("data", "synth_helpful.yaml")))
SMALL_SYNTH = json.dumps({n: {"n_train": 64, "n_validation": 16, "n_test": 16} for n in
                          ["synth_helpful_cooking", "synth_helpful_science", "synth_helpful_travel",
                           "synth_helpful_tech"]})

# The child: `cli.py fit` that SIGKILLs itself once it has written KILL_AFTER bytes into the KILL_NTH file opened
# for writing under the name KILL_NAME (or a temporary name of it) in KILL_DIR -- whoever writes the bytes (our
# plugin, or shutil's copy out of TMPDIR in Lightning's default save). Copies go through write() (no sendfile).
CHILD = r'''
import builtins, os, re, shutil, signal, sys

kill_dir, kill_name = os.environ.get("KILL_DIR"), os.environ.get("KILL_NAME")
kill_nth, kill_after = int(os.environ.get("KILL_NTH", "0")), int(os.environ.get("KILL_AFTER", "0"))
shutil._USE_CP_SENDFILE = False
real_open, opened = builtins.open, [0]


class Killing:
    def __init__(self, f):
        self._f, self.written = f, 0

    def write(self, data):
        data = bytes(data)
        if self.written + len(data) >= kill_after:
            self._f.write(data[: kill_after - self.written])
            self._f.flush()
            os.fsync(self._f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        self.written += len(data)
        return self._f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._f, name)


def killing_open(file, mode="r", *args, **kwargs):
    f = real_open(file, mode, *args, **kwargs)
    if kill_dir and "w" in mode and isinstance(file, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(file))
        name = re.sub(r"\.tmp-[^/]*$", "", os.path.basename(path))
        if os.path.dirname(path) == kill_dir and name == kill_name:
            opened[0] += 1
            if opened[0] == kill_nth:
                return Killing(f)
    return f


builtins.open = killing_open
sys.path.insert(0, os.getcwd())
from cli import main

main(sys.argv[1:])
'''


@contextlib.contextmanager
def tmpfs(directory: str, size: str):
    """A tmpfs of `size` mounted on `directory` for the block; the test is skipped where that is not possible."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    os.makedirs(directory, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", directory], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield directory
    finally:
        if subprocess.run(["umount", directory], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", directory], capture_output=True)


# Every epoch saves (save_top_k -1): Lightning writes last.ckpt only in a validation that also saved a top-k file.
EVERY_EPOCH = """
trainer:
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {monitor: val/acc, mode: max, save_top_k: -1, save_last: true, auto_insert_metric_name: false,
                  filename: "epoch{epoch}-step{step}-acc{val/acc:.4f}"}
"""


def _fit(root: str, cache: str, script: str, tmpdir: str, extra=(), kill: dict = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, TMPDIR=tmpdir, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONHASHSEED="0", **{k: str(v) for k, v in (kill or {}).items()})
    every_epoch = os.path.join(os.path.dirname(script), "every_epoch.yaml")
    with open(every_epoch, "w") as f:
        f.write(EVERY_EPOCH)
    args = ["fit", "--config", CPU, "--config", every_epoch, "--config", TINY, "--config", SYNTH,
            f"--data.cache_dir={cache}",
            f"--data.source_options={SMALL_SYNTH}", "--trainer.logger=false", f"--trainer.default_root_dir={root}",
            *extra]
    return subprocess.run([sys.executable, script, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def _intact(path: str) -> bool:
    """A complete zip archive whose members all pass their CRC-32 (what a torch checkpoint is)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except zipfile.BadZipFile:
        return False


def _weights(path: str) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


def test_sigkill_during_a_save_leaves_no_truncated_checkpoint_and_a_rerun_equals_a_clean_run(tmp_path):
    script = str(tmp_path / "child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    cache, killed, clean = str(tmp_path / "cache"), str(tmp_path / "killed"), str(tmp_path / "clean")
    ckpt_dir = os.path.join(killed, "checkpoints")
    with tmpfs(str(tmp_path / "tmpdir"), "64m") as tmpdir:
        # killed halfway through the second last.ckpt (end of epoch 1): the first one (end of epoch 0) exists
        run = _fit(killed, cache, script, tmpdir, kill=dict(KILL_DIR=ckpt_dir, KILL_NAME="last.ckpt", KILL_NTH=2,
                                                            KILL_AFTER=256 * 1024))
        assert run.returncode == -9, run.stderr[-3000:]
        finals = sorted(glob.glob(os.path.join(ckpt_dir, "*.ckpt")))
        assert finals, os.listdir(ckpt_dir)
        assert [p for p in finals if not _intact(p)] == []  # every file under a final name is complete
        last = torch.load(os.path.join(ckpt_dir, "last.ckpt"), map_location="cpu", weights_only=False)
        assert last["epoch"] == 0  # the previous last.ckpt, untouched by the killed save
        orphans = [n for n in os.listdir(ckpt_dir) if re.search(r"^last\.ckpt\.tmp-.+-\d+$", n)]
        assert len(orphans) == 1 and os.path.getsize(os.path.join(ckpt_dir, orphans[0])) == 256 * 1024

        resumed = _fit(killed, cache, script, tmpdir, extra=["--ckpt_path=last"])
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert not [n for n in os.listdir(ckpt_dir) if ".tmp-" in n]  # the orphan went with the next save
        clean_run = _fit(clean, cache, script, tmpdir)
        assert clean_run.returncode == 0, clean_run.stderr[-3000:]
    ours, theirs = _weights(os.path.join(ckpt_dir, "last.ckpt")), _weights(os.path.join(clean, "checkpoints",
                                                                                        "last.ckpt"))
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=0, msg=name)


def test_full_disk_keeps_the_previous_last_ckpt_and_names_the_path(tmp_path):
    from cli import main

    cli = main(["--config", CPU, "--config", TINY, "--config", SYNTH, "--trainer.logger=false",
                f"--trainer.default_root_dir={tmp_path}"], run=False)
    io = cli.trainer.strategy.checkpoint_io
    torch.manual_seed(0)
    small = {"state_dict": {"w": torch.randn(256 * 1024)}}  # 1 MiB
    with tmpfs(str(tmp_path / "disk"), "1600k") as disk, tmpfs(str(tmp_path / "tmpdir"), "64m") as tmpdir:
        path = os.path.join(disk, "last.ckpt")
        old_tmp = tempfile.tempdir
        tempfile.tempdir = tmpdir  # Lightning's default save would stage the file here, then copy it onto the disk
        try:
            io.save_checkpoint(small, path)
            with pytest.raises(OSError) as raised:
                io.save_checkpoint({"state_dict": {"w": torch.randn(512 * 1024)}}, path)  # 2 MiB: does not fit
        finally:
            tempfile.tempdir = old_tmp
        assert _intact(path)  # the previous last.ckpt, whole
        torch.testing.assert_close(_weights(path)["w"], small["state_dict"]["w"], rtol=0, atol=0)
        assert os.listdir(disk) == ["last.ckpt"]  # the temporary file went too
        assert raised.value.errno == errno.ENOSPC
        assert str(raised.value).startswith(f"cannot write {path}: no space left on the device")


# ---- the plugin alone (no root needed) --------------------------------------------------------------------------
def test_save_is_one_replace_and_enospc_keeps_the_previous_file(tmp_path, monkeypatch):
    from lightning_modules.checkpoint_io import AtomicCheckpointIO

    io, path = AtomicCheckpointIO(chosen_by="--trainer.default_root_dir"), str(tmp_path / "ckpts" / "last.ckpt")
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, path)
    assert os.listdir(tmp_path / "ckpts") == ["last.ckpt"]

    def full_disk(self, checkpoint, f):
        f.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(AtomicCheckpointIO, "write", full_disk)
    with pytest.raises(OSError, match=rf"cannot write {re.escape(path)}: no space left on the device; the "
                                      r"directory was chosen by --trainer.default_root_dir") as raised:
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}}, path)
    assert raised.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path / "ckpts") == ["last.ckpt"]
    torch.testing.assert_close(_weights(path)["w"], torch.ones(3))


def test_the_next_save_removes_temp_files_of_dead_writers_only(tmp_path):
    from datamodules.atomic_files import temp_path
    from lightning_modules.checkpoint_io import AtomicCheckpointIO

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    target = str(tmp_path / "epoch0.ckpt")
    orphan = temp_path(target).rsplit("-", 1)[0] + f"-{dead.pid}"
    live = temp_path(target).rsplit("-", 1)[0] + f"-{os.getppid()}"  # a live process of this host
    for name in (orphan, live):
        with open(name, "wb") as f:
            f.write(b"half")
    AtomicCheckpointIO().save_checkpoint({"state_dict": {}}, str(tmp_path / "last.ckpt"))
    assert sorted(os.listdir(tmp_path)) == sorted(["last.ckpt", os.path.basename(live)])


def test_every_cli_trainer_gets_the_plugin_and_a_chosen_plugin_is_kept(tmp_path):
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    from cli import main
    from lightning_modules.checkpoint_io import AtomicCheckpointIO, install_atomic_checkpoint_io

    cli = main(["--config", CPU, "--config", TINY, "--config", SYNTH, "--trainer.logger=false",
                f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert type(cli.trainer.strategy.checkpoint_io) is AtomicCheckpointIO

    class Mine(TorchCheckpointIO):
        pass

    kw = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    mine = L.Trainer(plugins=[Mine()], **kw)
    assert not install_atomic_checkpoint_io(mine) and type(mine.strategy.checkpoint_io) is Mine
    wrapped = L.Trainer(plugins=[AsyncCheckpointIO()], **kw)
    assert install_atomic_checkpoint_io(wrapped)
    assert type(wrapped.strategy.checkpoint_io.checkpoint_io) is AtomicCheckpointIO
    ddp = L.Trainer(strategy="ddp", devices=2, **kw)  # rank 0 alone calls save_checkpoint (Strategy's rule)
    assert install_atomic_checkpoint_io(ddp) and type(ddp.strategy.checkpoint_io) is AtomicCheckpointIO
