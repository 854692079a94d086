"""The torch build a node gets (`make install` / `make torch-plan`, common/torch_build.py), driven by a stub
`nvidia-smi` on PATH: the command it would run is checked, nothing is downloaded. The wheel index it names is a
local HTTP server standing in for https://download.pytorch.org/whl (TORCH_INDEX_URL), or one that cannot be reached:
then the command installs from pip's configured index and one line says so. And the run-time refusal of a build
whose kernels do not cover the GPU, driven through the capability / arch-list / driver values the check reads."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from common.torch_build import (
    BUILDS,
    WHEEL_INDEX,
    GpuInventory,
    arch_covers,
    build_problem,
    choose_index,
    installed_build,
    min_driver_for,
    parse_capability,
    plan_build,
    probe_index,
    query_driver,
)

REPO = Path(__file__).resolve().parents[2]
INDEX = "https://download.pytorch.org/whl"
FALLBACK = "cannot be reached"  # the one line of a plan that falls back to pip's configured index


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def wheel_index(tmp_path_factory):
    """A local stand-in for the PyTorch wheel index (TORCH_INDEX_URL): a torch page in each build's folder."""
    root = tmp_path_factory.mktemp("index")
    for build in BUILDS:
        (root / "whl" / build / "torch").mkdir(parents=True)
        (root / "whl" / build / "torch" / "index.html").write_text("<html><body></body></html>")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl"
    server.shutdown()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/whl"  # nothing listens there once closed


# torch.cuda.get_arch_list() of the 2.13 builds (RELEASE.md matrix)
CU126_ARCHES = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
CU130_ARCHES = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]


def stub_bin(tmp_path: Path, rows: list[str] | None) -> Path:
    """A directory holding a fake `nvidia-smi` that prints `rows` for --query-gpu (None: no nvidia-smi at all; an
    empty list: it runs but finds no GPU, exit 9 as the real one does)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if rows is not None:
        body = "".join(f"echo '{row}'\n" for row in rows)  # shell builtins only: PATH holds nothing else
        code = 0 if rows else 9
        script = bin_dir / "nvidia-smi"
        script.write_text(f"#!/bin/sh\n{body}exit {code}\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    for tool in ("make", "sh", "python3"):  # what the Makefile target needs, and nothing else from the real PATH
        os.symlink(shutil.which(tool) if tool != "python3" else sys.executable, bin_dir / tool)
    return bin_dir


def make_plan(tmp_path: Path, rows: list[str] | None, stderr: bool = False, **env: str) -> str:
    bin_dir = stub_bin(tmp_path, rows)
    run_env = {"PATH": str(bin_dir), "HOME": str(tmp_path), **env}
    out = subprocess.run(
        ["make", "-s", "-C", str(REPO), "torch-plan"], env=run_env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout + out.stderr if stderr else out.stdout


@pytest.mark.parametrize(
    "rows, build",
    [
        (["7.0, 535.104.05"] * 8, "cu126"),  # the users' V100 nodes
        (["8.0, 580.65.06"] * 8, "cu130"),  # A100
        (["9.0, 590.10"], "cu130"),  # H100/H200
        (None, "cpu"),  # no nvidia-smi
        ([], "cpu"),  # nvidia-smi finds no GPU
        (["8.0, 575.51", "7.0, 575.51"], "cu126"),  # a mixed node: the oldest GPU decides
        (["8.6, 550.54.15"], "cu126"),  # Ampere with a driver too old for CUDA 13
    ],
    ids=["v100", "a100", "h100", "no-nvidia-smi", "no-gpu", "mixed-node", "old-driver"],
)
def test_make_torch_plan_picks_the_build_whose_kernels_cover_the_node(tmp_path, wheel_index, rows, build):
    out = make_plan(tmp_path, rows, stderr=True, TORCH_INDEX_URL=wheel_index)
    assert f"torch build: {build} " in out
    assert f"install: python -m pip install torch==2.13.0 --index-url {wheel_index}/{build}" in out
    assert FALLBACK not in out


def test_the_default_index_is_pytorchs_and_each_build_is_a_folder_of_it():
    assert WHEEL_INDEX == INDEX
    for name, build in BUILDS.items():
        assert build.pip_command() == [
            "python",
            "-m",
            "pip",
            "install",
            "torch==2.13.0",
            "--index-url",
            f"{INDEX}/{name}",
        ]


def test_the_override_wins_and_a_wrong_one_is_named(tmp_path, wheel_index):
    plan = make_plan(tmp_path, ["7.0, 535.1"], TORCH_CUDA="cu130", TORCH_INDEX_URL=wheel_index)
    assert "torch build: cu130 (TORCH_CUDA=cu130)" in plan
    (tmp_path / "bad").mkdir()
    bin_dir = stub_bin(tmp_path / "bad", None)
    bad = subprocess.run(
        ["make", "-s", "-C", str(REPO), "torch-plan"],
        env={"PATH": str(bin_dir), "TORCH_CUDA": "cu121"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0
    assert "TORCH_CUDA='cu121': want one of cu126, cu130, cpu, auto" in bad.stderr


def test_a_gpu_older_than_every_build_is_refused():
    with pytest.raises(ValueError, match="capability 3.7: no torch 2.13.0 build"):
        plan_build(GpuInventory(((3, 7),), "470.1"))
    with pytest.raises(ValueError, match="not a compute capability: '7'"):
        parse_capability("7")


def test_the_install_command_for_the_venv_keeps_a_matching_torch_and_replaces_another(tmp_path, wheel_index):
    """What `make install` runs: nothing when the venv's torch is already the planned build, else the pip line."""
    this = installed_build(sys.executable)
    assert this is not None and this[1] is None  # the CPU build in CI
    env = {**os.environ, "PATH": str(stub_bin(tmp_path, None)), "TORCH_INDEX_URL": wheel_index}
    run = [sys.executable, "-m", "common.torch_build_cli", "plan", "--python", sys.executable]
    kept = subprocess.run(run, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert kept.returncode == 0 and kept.stdout == "", kept.stdout
    assert "the cpu build: kept" in kept.stderr
    replaced = subprocess.run(run, cwd=REPO, env={**env, "TORCH_CUDA": "cu126"}, capture_output=True, text=True)
    assert replaced.stdout.strip() == f"{sys.executable} -m pip install torch==2.13.0 --index-url {wheel_index}/cu126"
    assert "needs the cu126 build" in replaced.stderr and FALLBACK not in replaced.stderr


@pytest.mark.parametrize(
    "build, pin", [("cu126", "torch==2.13.0+cu126"), ("cu130", "torch==2.13.0"), ("cpu", "torch==2.13.0")]
)
def test_an_unreachable_wheel_index_falls_back_to_pips_configured_index_in_one_line(tmp_path, build, pin):
    """A cluster that reaches only a PyPI mirror: the wheel index is asked once (here a port nobody listens on), and
    the command `make install` runs has no --index-url: pip's own settings decide where torch comes from."""
    env = {**os.environ, "PATH": str(stub_bin(tmp_path, None)), "TORCH_INDEX_URL": closed_port_url()}
    env["TORCH_CUDA"] = build
    started = time.monotonic()
    run = [sys.executable, "-m", "common.torch_build_cli", "plan", "--python", "venv/bin/python"]
    out = subprocess.run(run, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and time.monotonic() - started < 30, out.stderr
    assert out.stdout.strip() == f"venv/bin/python -m pip install {pin}"
    (note,) = [line for line in out.stderr.splitlines() if FALLBACK in line]
    assert note.startswith(f"torch_build: the PyTorch wheel index {env['TORCH_INDEX_URL']}/{build} cannot be reached")
    assert f"installing {pin} from pip's configured index" in note and "TORCH_INDEX_URL" in note


def test_a_wheel_index_without_the_build_falls_back_naming_the_answer(tmp_path, wheel_index):
    """A mirror that answers but lacks the build's page (HTTP 404) is not used either."""
    plan = make_plan(tmp_path, ["7.0, 535.1"], stderr=True, TORCH_INDEX_URL=f"{wheel_index}/cu126")  # .../cu126/cu126
    assert "install: python -m pip install torch==2.13.0+cu126" in plan.splitlines() and "(HTTP 404)" in plan


def test_a_silent_wheel_index_is_given_up_after_the_timeout():
    """A firewall that swallows the connection: one bounded wait, not pip's five retries per request."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel completes the handshake; nothing ever answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/whl/cpu/torch/"
        started = time.monotonic()
        problem = probe_index(url, timeout=0.5)
        assert problem is not None and time.monotonic() - started < 5, problem  # pip: 5 retries, minutes
    choice = choose_index(BUILDS["cu130"], env={}, probe=lambda url: None if url == f"{INDEX}/cu130/torch/" else "?")
    assert choice.index == INDEX and choice.note is None


def fake_wheel(folder: Path, version: str) -> None:
    """An empty but valid wheel of torch `version` (what a mirror or pip's find-links folder would hold)."""
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(folder / f"torch-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")


def test_the_fallback_pins_pick_the_right_wheel_from_a_mirror(tmp_path):
    """Real pip on an index holding PyPI's default wheel and the CPU build: the CPU plan's pin takes the CPU build;
    the V100 plan's pin refuses the default wheel (no sm_70 in it) by name instead of installing it."""
    fake_wheel(tmp_path, "2.13.0")
    fake_wheel(tmp_path, "2.13.0+cpu")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--find-links", str(tmp_path)]
    pip += ["--ignore-installed", "--quiet", "--report", "-"]
    pin = BUILDS["cpu"].pip_command(index=None)[-1]
    out = subprocess.run([*pip, pin], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [i["metadata"]["version"] for i in json.loads(out.stdout)["install"]] == ["2.13.0+cpu"]
    pin = BUILDS["cu126"].pip_command(index=None)[-1]
    refused = subprocess.run([*pip, pin], env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "No matching distribution found for torch==2.13.0+cu126" in refused.stderr


@pytest.mark.parametrize(
    "capability, arches, covered",
    [
        ((7, 0), CU126_ARCHES, True),
        ((7, 0), CU130_ARCHES, False),  # the documented trap: the PyPI default on a V100
        ((8, 6), ["sm_80"], True),  # same major, newer minor: binary compatible
        ((8, 0), ["sm_86"], False),
        ((10, 0), ["sm_90", "compute_90"], True),  # PTX compiled by the driver
        ((10, 0), ["sm_90"], False),
        ((9, 0), [], False),
    ],
)
def test_arch_coverage(capability, arches, covered):
    assert arch_covers(capability, arches) is covered


def test_a_build_without_the_gpus_kernels_is_refused_in_one_line_with_the_fix():
    problem = build_problem((7, 0), CU130_ARCHES, "13.0", "580.65.06")
    assert problem is not None and "\n" not in problem
    assert "no kernels for compute capability 7.0" in problem
    assert "TORCH_CUDA=cu126 make install" in problem and f"{INDEX}/cu126" in problem
    assert build_problem((7, 0), CU126_ARCHES, "12.6", "535.104.05") is None
    assert build_problem((9, 0), CU130_ARCHES, "13.0", "580.65.06") is None
    old_driver = build_problem((9, 0), CU130_ARCHES, "13.0", "575.51.03")
    assert old_driver is not None and "driver 575.51.03 is older than torch's CUDA 13.0 needs (driver >= 580)" in (
        old_driver
    )
    assert build_problem((8, 0), CU126_ARCHES, "12.6", "520.61") is not None  # below CUDA 12's 525
    cpu_build = build_problem((9, 0), [], None, None)
    assert cpu_build is not None and "CPU build" in cpu_build and "TORCH_CUDA=cu130" in cpu_build


@pytest.mark.parametrize("driver", [None, "", "N/A"])
def test_an_unknown_driver_skips_that_check_and_nothing_else(driver):
    assert build_problem((9, 0), CU130_ARCHES, "13.0", driver) is None
    assert "no kernels" in build_problem((7, 0), CU130_ARCHES, "13.0", driver)
    assert min_driver_for("11.8") is None and build_problem((8, 0), ["sm_80"], "11.8", "450.1") is None


@pytest.mark.parametrize(
    "script, driver",
    [
        ("echo '580.65.06'; echo '580.65.06'", "580.65.06"),
        ("echo 'Failed to initialize NVML: Driver/library version mismatch'; exit 18", None),
        ("echo '[N/A]'", None),
        ("sleep 0; exit 0", None),  # prints nothing
        (None, None),  # no nvidia-smi on PATH
    ],
    ids=["two-gpus", "nvml-mismatch", "not-available", "silent", "missing"],
)
def test_the_driver_is_read_from_nvidia_smi_and_anything_unreadable_is_unknown(tmp_path, monkeypatch, script, driver):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if script is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\n{script}\n")
        smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert query_driver() == driver


def test_every_build_of_the_table_is_in_the_docs_gpu_page():
    section = (REPO / "docs" / "gpu.md").read_text()
    for name in BUILDS:
        assert f"`{name}`" in section
        assert f"--index-url {INDEX}/{name}" in section or name != "cu126"
    assert " ".join(BUILDS["cu126"].pip_command("pip")[1:]).replace("-m pip ", "") in section
