"""A real single-node SLURM for the launcher tests: munged, slurmctld and slurmd on localhost, configured in a
temporary folder (Debian's `slurm-wlm` 22.05 + `munge`, installed by `.ci/run`). Needs root (slurmd runs jobs as the
submitting user). `python tests/slurm_cluster.py up DIR` / `down DIR` start and stop one by hand.

The settings that make one machine a cluster (FIELD-NOTES): munged as the munge user with a socket in a folder
whose parents are o+x; slurmctld and slurmd as root with `proctrack/linuxproc`, `task/none`, no accounting
(`--status` reads states from squeue, kept `MinJobAge` seconds), one node with the machine's cores, on free ports.

It is set up like a site's cluster rather than a textbook one, since that is where the launcher first failed: the
default partition `debug` has a 30-minute MaxTime (under the 4 h the launcher once asked by default) and a `long`
partition allows a day; `EnforcePartLimits=ALL` refuses a job over its partition's limits at submission, as many
sites do; `MinJobAge` is SLURM's default 300 s, after which SLURM forgets an ended job.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo")


def available() -> str:
    """'' when a cluster can be started here, else why not."""
    if os.geteuid() != 0:
        return "not root (slurmd must run jobs as the submitting user)"
    missing = [b for b in BINARIES if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]
    if missing:
        return f"SLURM / munge not installed ({missing}); .ci/run installs slurmctld slurmd slurm-client munge"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def up(folder: str, cpus: int | None = None) -> dict[str, str]:
    """Start the cluster; returns the environment its clients need (SLURM_CONF)."""
    folder = os.path.abspath(folder)
    os.makedirs(folder, exist_ok=True)
    os.chmod(folder, 0o755)
    parent = os.path.dirname(folder)
    while parent != "/":  # munged checks every parent of its socket and log for o+x
        if not os.stat(parent).st_mode & 0o001:
            raise RuntimeError(f"{folder}: its parent {parent} is not o+x, which munged refuses; start the test "
                               "cluster under /tmp (tempfile.mkdtemp())")
        parent = os.path.dirname(parent)
    munge = os.path.join(folder, "munge")
    for sub in ("state", "spool", "log"):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    os.makedirs(munge, exist_ok=True)
    key = os.path.join(munge, "munge.key")
    if os.path.isfile("/etc/munge/munge.key"):  # the package's key (its postinst makes one)
        shutil.copy("/etc/munge/munge.key", key)
    else:
        subprocess.run([_binary("mungekey"), "--create", f"--keyfile={key}"], check=True)
    shutil.chown(munge, "munge", "munge")
    shutil.chown(os.path.join(munge, "munge.key"), "munge", "munge")
    os.chmod(munge, 0o711)
    os.chmod(os.path.join(munge, "munge.key"), 0o400)
    socket_path = os.path.join(munge, "munge.socket")
    subprocess.run(["runuser", "-u", "munge", "--", _binary("munged"), f"--socket={socket_path}",
                    f"--key-file={munge}/munge.key", f"--pid-file={munge}/munged.pid",
                    f"--log-file={munge}/munged.log", f"--seed-file={munge}/seed"], check=True)
    host, cpus = socket.gethostname(), cpus or os.cpu_count() or 1
    port = _free_port()
    conf = os.path.join(folder, "slurm.conf")
    with open(conf, "w") as f:
        f.write(f"""ClusterName=shiftgen
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={port}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={socket_path}
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MinJobAge=300
EnforcePartLimits=ALL
ReturnToService=2
MpiDefault=none
KillWait=5
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=30 State=UP
PartitionName=long Nodes=ALL MaxTime=1-00:00:00 State=UP
""")
    env = {"SLURM_CONF": conf}
    full = dict(os.environ, **env)
    subprocess.run([_binary("slurmctld"), "-f", conf], check=True, env=full)
    subprocess.run([_binary("slurmd"), "-f", conf], check=True, env=full)
    deadline = time.time() + 60
    while time.time() < deadline:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=full)
        if out.stdout.strip() == "idle":
            return env
        time.sleep(0.5)
    raise RuntimeError(f"the test cluster in {folder} did not reach 'idle' in 60 s: {out.stdout} {out.stderr}\n"
                       + open(os.path.join(folder, "log", "slurmctld.log")).read()[-2000:])


def unreachable_conf(folder: str) -> str:
    """A copy of the cluster's slurm.conf whose controller port nothing listens on: clients that read it cannot
    reach SLURM (as on a login node whose controller is down), while the cluster itself keeps running."""
    conf = open(os.path.join(folder, "slurm.conf")).read()
    lines = [f"SlurmctldPort={_free_port()}" if line.startswith("SlurmctldPort=") else line
             for line in conf.splitlines()]
    path = os.path.join(folder, "unreachable.conf")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def down(folder: str) -> None:
    """Stop the daemons (jobs still running are killed with slurmd) and munged."""
    folder = os.path.abspath(folder)
    for pid_file in ("slurmd.pid", "slurmctld.pid", os.path.join("munge", "munged.pid")):
        try:
            with open(os.path.join(folder, pid_file)) as f:
                os.kill(int(f.read().strip()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
    time.sleep(1)


if __name__ == "__main__":
    action, where = sys.argv[1], sys.argv[2]
    if action == "up":
        print(f"export SLURM_CONF={up(where)['SLURM_CONF']}")
    else:
        down(where)
