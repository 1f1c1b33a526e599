"""The machine fingerprint (protocols/engine/machine.py) on literal /proc/cpuinfo texts."""
from protocols.engine.machine import cpu_model, describe, fingerprint, fingerprint_id, kernel_flags

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 avx2 fma pni avx f16c avx512f avx512_vnni sha_ni avx512vbmi
bugs\t\t: sysret_ss_attrs

processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 avx2 fma pni avx f16c avx512f avx512_vnni sha_ni avx512vbmi
"""


def test_flags_are_the_kernel_relevant_subset_sorted():
    # sha_ni / avx512vbmi / sse are present but change no float kernel; avx512bw is absent
    assert kernel_flags(CPUINFO) == ["avx", "avx2", "avx512_vnni", "avx512f", "f16c", "fma"]
    assert kernel_flags("processor : 0\n") == []
    assert cpu_model(CPUINFO) == "AMD EPYC 7B13"
    assert cpu_model("flags : avx\n") is None


def test_fingerprint_fields_and_a_stable_id():
    fp = fingerprint(cpuinfo=CPUINFO, threads=2)
    assert (fp["cpu"], fp["threads"]) == ("AMD EPYC 7B13", 2)
    assert fp["flags"] == ["avx", "avx2", "avx512_vnni", "avx512f", "f16c", "fma"]
    assert len(fp["id"]) == 12 and int(fp["id"], 16) >= 0
    assert fingerprint(cpuinfo=CPUINFO, threads=2)["id"] == fp["id"]  # same machine, same id
    assert fingerprint_id(fp) == fp["id"]  # the id over the other fields, its own left out


def test_the_id_changes_with_threads_flags_cpu_and_versions():
    fp = fingerprint(cpuinfo=CPUINFO, threads=2)
    ids = {fp["id"], fingerprint(cpuinfo=CPUINFO, threads=1)["id"],
           fingerprint(cpuinfo=CPUINFO.replace(" avx512f", ""), threads=2)["id"],
           fingerprint(cpuinfo=CPUINFO.replace("7B13", "9654"), threads=2)["id"],
           fingerprint_id({**fp, "torch": "0.0.1"})}
    assert len(ids) == 5


def test_a_machine_without_cpuinfo_falls_back_to_the_platform():
    fp = fingerprint(cpuinfo="", threads=4)
    assert fp["flags"] == [] and fp["cpu"] and fp["cpu"] != "AMD EPYC 7B13"


def test_describe_is_one_line():
    fp = {"cpu": "AMD EPYC", "flags": ["avx2", "fma"], "threads": 2, "torch": "2.3.1", "transformers": "4.44.0"}
    assert describe(fp) == "AMD EPYC, avx2+fma, 2 threads, torch 2.3.1, transformers 4.44.0"
    assert describe({**fp, "flags": [], "threads": 1}) == "AMD EPYC, no kernel flags, 1 thread, torch 2.3.1, transformers 4.44.0"


def test_a_w2s_results_json_records_the_machine(tmp_path):
    from tests.test_w2s_report import _run

    _, _, results = _run(tmp_path)
    assert results["machine"] == fingerprint()


def test_a_part_b_results_json_records_the_stages_thread_count(tmp_path):
    """The report process is not where the stages ran: their thread count (OMP_NUM_THREADS the stages were given)
    is recorded, not the report's own."""
    import json
    from types import SimpleNamespace

    from protocols.mixture.report import write_report

    exp = SimpleNamespace(family="fam", summary="a literal experiment")
    stage = SimpleNamespace(name="rl", title="RL", sft=False)
    records = {0: {"rl": {"status": "failed", "error": "not run"}}}
    write_report(str(tmp_path), "x_seeds_0", exp, [stage], records, 1.0, command="python -m protocols.mixture x",
                 threads=3)
    with open(tmp_path / "x_seeds_0_results.json") as f:
        machine = json.load(f)["machine"]
    assert machine == fingerprint(threads=3) and machine["threads"] == 3
