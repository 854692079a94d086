"""Static checks of the Slurm scripts: bash -n, shellcheck -x, the documented #SBATCH defaults."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*(REPO / "slurm").glob("*.sh"), *(REPO / "tests" / "slurm").glob("*.sh"), REPO / ".ci" / "run"])
IDS = [str(p.relative_to(REPO)) for p in SCRIPTS]


def sbatch_directives(path: Path) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^#SBATCH\s+(\S+)", path.read_text(), re.M)]


@pytest.fixture(scope="session")
def shellcheck() -> str:
    exe = shutil.which("shellcheck")
    if exe is None and os.geteuid() == 0:  # as in CI: install the missing Debian packages
        r = subprocess.run(
            ["bash", str(REPO / "tests/slurm/local_cluster.sh"), "install"], capture_output=True, text=True, timeout=900
        )
        assert r.returncode == 0, f"local_cluster.sh install failed:\n{r.stdout}{r.stderr}"
        exe = shutil.which("shellcheck")
    if exe is None:
        pytest.skip("[needs-tool] shellcheck is missing: apt-get install shellcheck (as root, the tests install it)")
    return exe


def test_scripts_found():
    names = {p.name for p in SCRIPTS}
    assert {
        "common.sh",
        "pretrain_base.sh",
        "pretrain_large.sh",
        "prep_data.sh",
        "dedup_data.sh",
        "finetune_glue.sh",
        "local_cluster.sh",
        "run",
    } <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=IDS)
def test_bash_syntax(script):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=IDS)
def test_shellcheck(script, shellcheck):
    # -x follows `source` (the scripts point shellcheck at slurm/common.sh with a source= directive)
    r = subprocess.run(
        [shellcheck, "-x", "-S", "style", str(script)], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("name", ["pretrain_base.sh", "pretrain_large.sh"])
def test_pretrain_defaults(name):
    d = sbatch_directives(REPO / "slurm" / name)
    for want in [
        "--nodes=8",
        "--ntasks-per-node=8",
        "--gpus-per-node=8",
        "--requeue",
        "--signal=B:USR1@300",
        "--open-mode=append",
    ]:
        assert want in d, f"{name}: missing #SBATCH {want}"


def test_pretrain_large_reuses_base():
    text = (REPO / "slurm/pretrain_large.sh").read_text()
    assert "configs/elasticbert_large.yaml" in text
    assert re.search(r'^exec bash "\$EB_ROOT/slurm/pretrain_base.sh" "\$@"$', text, re.M)
    assert "eb_run_preemptible" not in text  # no copy of the launch logic


def test_pretrain_base_defaults():
    text = (REPO / "slurm/pretrain_base.sh").read_text()
    assert "CONFIG=${CONFIG:-configs/elasticbert_base.yaml}" in text
    assert "DS_CONFIG=${DS_CONFIG:-}" in text  # unless overridden, the run config's train.ds_config decides
    train = yaml.safe_load((REPO / "configs/elasticbert_base.yaml").read_text())["train"]
    assert (REPO / train["ds_config"]).is_file()
    # the precision follows the hardware (bf16 / fp16 on V100s / fp32 on CPU) with no flag: nothing pinned here
    assert train.get("precision", "auto") == "auto"
    ds = json.loads((REPO / train["ds_config"]).read_text())
    assert all(ds.get(k, {}).get("enabled", "auto") == "auto" for k in ("bf16", "fp16")), ds


def test_prep_data_has_no_array_directive():
    # the finalize job is submitted with the same file: an #SBATCH --array would turn it into an array too
    assert not [d for d in sbatch_directives(REPO / "slurm/prep_data.sh") if d.startswith(("--array", "-a"))]


def test_finetune_list_matches_default_array():
    env = {k: v for k, v in os.environ.items() if k not in ("TASKS", "SEEDS")}
    r = subprocess.run(
        ["bash", "slurm/finetune_glue.sh", "list"], capture_output=True, text=True, timeout=30, cwd=REPO, env=env
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 40 and lines[0] == "0 cola 1" and lines[-1] == "39 rte 5"
    assert "--array=0-39" in sbatch_directives(REPO / "slurm/finetune_glue.sh")


def test_scripts_source_only_common_sh():
    for p in (REPO / "slurm").glob("*.sh"):
        sources = re.findall(r'^\s*(?:source|\.)\s+("[^"]*"|\S+)', p.read_text(), re.M)
        assert all(s.endswith('/slurm/common.sh"') for s in sources), (p.name, sources)


def test_a_failed_step_names_the_first_task_that_did_not_just_lose_a_peer(tmp_path):
    """srun reports each task as it ends; the task killed first, not the survivors that exited 5 ("a peer is
    gone", pretrain.guards.PeerLost), is the one the failed step's summary line names."""
    out = tmp_path / "job.out"
    earlier = "srun: error: n9: task 3: Killed\n"  # a previous run of the job, before the step's offset
    out.write_text(
        earlier
        + " 4: pretrain: error: rank 4 on n2, step 6: a collective failed because another rank of the job is gone\n"
        + "srun: error: n2: tasks 4-5: Exited with exit code 5\n"
        + "srun: error: n5: task 17: Killed\n"
        + "srun: error: n1: task 0: Exited with exit code 5\n"
    )
    script = f'source "{REPO}/slurm/common.sh"; _eb_first_failed_task "$1" "$2"'
    r = subprocess.run(["bash", "-c", script, "t", str(out), str(len(earlier))], capture_output=True, text=True)
    assert r.stdout == ": first to fail: n5 task 17 (Killed); 3 task line(s) in all", r.stderr
    out.write_text(earlier + "srun: error: n2: tasks 4-5: Exited with exit code 1\n")
    r = subprocess.run(["bash", "-c", script, "t", str(out), str(len(earlier))], capture_output=True, text=True)
    assert r.stdout == ": first to fail: n2 task 4-5 (Exited with exit code 1); 1 task line(s) in all"
    out.write_text(earlier)  # nothing from srun after the offset: no claim
    r = subprocess.run(["bash", "-c", script, "t", str(out), str(len(earlier))], capture_output=True, text=True)
    assert r.stdout == "" and r.returncode == 0
