"""Which torch build a node's GPUs need, and whether the installed one has their kernels.

A torch wheel carries compiled kernels (SASS) for a list of GPU architectures, plus PTX for the newest, which the
driver can compile for a later GPU. What the pinned torch (2.13) offers, from the PyTorch release matrix
(RELEASE.md of 2.11-2.14, pytorch/pytorch#172352):

  cu126  CUDA 12.6: sm_50 ... sm_90 — the only 2.11-2.14 build that still has Volta (sm_70, V100) and the other
         pre-Turing GPUs; driver >= 525 (CUDA 12 minor-version compatibility). RFC #190385 drops it in 2.15, so torch
         <= 2.14 is the last that runs V100s.
  cu130  CUDA 13.0, the default wheel on PyPI: sm_75 (Turing) and newer; driver >= 580.
  cpu    no GPU.

`plan_build` picks one from the capabilities `nvidia-smi --query-gpu=compute_cap` reports (the oldest GPU decides on
a mixed node) and the driver version; `python -m common.torch_build_cli plan` prints it with the pip command that
installs it (the Makefile's `install` runs that command). The command names the PyTorch wheel index of the build
(`TORCH_INDEX_URL` replaces https://download.pytorch.org/whl, e.g. by a mirror of it); `choose_index` first asks that
index once, with a few seconds' timeout, and when it does not answer (a cluster that reaches only a PyPI mirror) the
command installs from pip's configured index instead (pip.conf, PIP_INDEX_URL) and says so in one line, rather than
pip retrying the unreachable index for minutes. At run time `build_problem` refuses a torch whose
kernels do not cover the GPU before any rank starts work: on a V100 the CUDA 13 build would otherwise fail at the
first kernel with "no kernel image is available for execution on the device", after every rank had imported and
rendezvoused.

Standard library only, and torch is imported inside the one function that reads the running build: the Makefile runs
this file with the system Python before any virtual environment exists.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .errors import UserError

TORCH_VERSION = "2.13.0"  # the version constraints.txt's stack was tested with (installed first, on its own)
WHEEL_INDEX = "https://download.pytorch.org/whl"  # TORCH_INDEX_URL replaces it; each build is a folder of it
PROBE_TIMEOUT_S = 5.0  # one request to the wheel index: unanswered this long, pip's configured index is used
SM70 = (7, 0)


@dataclass(frozen=True)
class Build:
    """One torch build of the pinned version: the GPUs it has kernels for and the driver it needs."""

    name: str
    cuda: str | None  # torch.version.cuda of the build
    min_capability: tuple[int, int] | None  # oldest GPU with kernels in it (None: no GPU code at all)
    min_driver: int | None  # the NVIDIA driver's major version it needs
    # The local version label pip must match on an index other than PyTorch's (a PyPI mirror): '' where PyPI's
    # default wheel runs too (cu130 is that wheel; the cpu build is preferred when the index has it, `+cpu` sorting
    # above the bare version, and PyPI's CUDA wheel also runs on a CPU); '+cu126' where it does not (no sm_70 in the
    # default wheel): pip then fails naming the missing build instead of installing one that cannot run on a V100.
    mirror_label: str = ""

    def pip_command(
        self, python: str = "python", version: str = TORCH_VERSION, index: str | None = WHEEL_INDEX
    ) -> list[str]:
        """The pip command that installs this build from the PyTorch wheel index at `index` (its folder for this
        build), or with `index=None` from pip's configured index (the version pinned with `mirror_label`)."""
        if index is None:
            return [python, "-m", "pip", "install", f"torch=={version}{self.mirror_label}"]
        return [python, "-m", "pip", "install", f"torch=={version}", "--index-url", self.index_url(index)]

    def index_url(self, index: str = WHEEL_INDEX) -> str:
        return f"{index.rstrip('/')}/{self.name}"


BUILDS = {
    "cu126": Build("cu126", "12.6", (5, 0), 525, mirror_label="+cu126"),
    "cu130": Build("cu130", "13.0", (7, 5), 580),
    "cpu": Build("cpu", None, None, None),
}


@dataclass(frozen=True)
class GpuInventory:
    """What `nvidia-smi` says about this node: one compute capability per GPU and the driver version."""

    capabilities: tuple[tuple[int, int], ...] = ()
    driver: str = ""

    @property
    def driver_major(self) -> int | None:
        head = self.driver.split(".")[0]
        return int(head) if head.isdigit() else None


@dataclass(frozen=True)
class BuildPlan:
    build: Build
    reason: str


@dataclass(frozen=True)
class IndexChoice:
    """Where pip gets torch from: the PyTorch wheel index at `index`, or (None) pip's configured index, with the one
    line that says why (None when the wheel index answered)."""

    index: str | None
    note: str | None = None


def probe_index(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why `url` cannot be fetched (None: it answered with a page), after ONE request bounded by `timeout` seconds
    in all (name lookup included: it runs in a thread that is abandoned when late). Proxies from the environment
    (https_proxy, no_proxy) as pip uses them; the CA bundle pip is told to use (PIP_CERT) when set."""
    found: list[str | None] = []

    def fetch() -> None:
        cafile = os.environ.get("PIP_CERT") or None
        try:
            context = ssl.create_default_context(cafile=cafile) if url.startswith("https:") else None
            with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
                found.append(None if response.status < 400 else f"HTTP {response.status}")
        except urllib.error.HTTPError as e:
            found.append(f"HTTP {e.code}")
        except urllib.error.URLError as e:
            found.append(str(e.reason))
        except (OSError, ValueError, ssl.SSLError) as e:
            found.append(str(e) or type(e).__name__)

    worker = threading.Thread(target=fetch, daemon=True)
    worker.start()
    worker.join(timeout + 0.5)
    return found[0] if found else f"no answer in {timeout:g} s"


def choose_index(
    build: Build,
    version: str = TORCH_VERSION,
    env: Mapping[str, str] = os.environ,
    probe: Callable[[str], str | None] = probe_index,
) -> IndexChoice:
    """The PyTorch wheel index (`TORCH_INDEX_URL` or WHEEL_INDEX) when its page of torch for `build` answers; else
    pip's configured index, with the one line that says so."""
    index = env.get("TORCH_INDEX_URL") or WHEEL_INDEX
    problem = probe(f"{build.index_url(index)}/torch/")
    if problem is None:
        return IndexChoice(index)
    pin = f"torch=={version}{build.mirror_label}"
    return IndexChoice(
        None,
        f"the PyTorch wheel index {build.index_url(index)} cannot be reached ({problem}): installing {pin} from "
        "pip's configured index (pip.conf, PIP_INDEX_URL) instead; TORCH_INDEX_URL=<a mirror of "
        f"{WHEEL_INDEX}> picks another",
    )


def parse_capability(text: str) -> tuple[int, int]:
    """'7.0' -> (7, 0); anything else is a ValueError that names the text."""
    major, _, minor = text.strip().partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise ValueError(f"not a compute capability: {text.strip()!r} (want MAJOR.MINOR, e.g. 7.0)")
    return int(major), int(minor)


def query_gpus(nvidia_smi: str = "nvidia-smi") -> GpuInventory:
    """The node's GPUs from `nvidia-smi` (an empty inventory when it is missing or finds no GPU)."""
    exe = shutil.which(nvidia_smi)
    if exe is None:
        return GpuInventory()
    try:
        out = subprocess.run(
            [exe, "--query-gpu=compute_cap,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return GpuInventory()
    if out.returncode != 0:
        return GpuInventory()
    rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]
    caps = tuple(parse_capability(r[0]) for r in rows)
    return GpuInventory(caps, rows[0][1] if rows and len(rows[0]) > 1 else "")


def plan_build(gpus: GpuInventory, override: str | None = None) -> BuildPlan:
    """The build whose kernels cover every GPU of the node (`override`: cu126 | cu130 | cpu | auto)."""
    if override and override != "auto":
        if override not in BUILDS:
            raise ValueError(f"TORCH_CUDA={override!r}: want one of {', '.join([*BUILDS, 'auto'])}")
        return BuildPlan(BUILDS[override], f"TORCH_CUDA={override}")
    if not gpus.capabilities:
        return BuildPlan(BUILDS["cpu"], "no NVIDIA GPU found (nvidia-smi missing or lists none)")
    oldest = min(gpus.capabilities)
    shown = ", ".join(sorted({f"{a}.{b}" for a, b in gpus.capabilities}))
    if oldest < BUILDS["cu126"].min_capability:  # type: ignore[operator]
        raise ValueError(f"GPU compute capability {oldest[0]}.{oldest[1]}: no torch {TORCH_VERSION} build has kernels")
    if oldest < BUILDS["cu130"].min_capability:  # type: ignore[operator]
        return BuildPlan(BUILDS["cu126"], f"compute capability {shown}: sm_70 (V100) is only in the CUDA 12.6 build")
    driver = gpus.driver_major
    if driver is not None and driver < BUILDS["cu130"].min_driver:  # type: ignore[operator]
        return BuildPlan(
            BUILDS["cu126"], f"compute capability {shown}, but driver {gpus.driver} < 580 (CUDA 13 needs 580)"
        )
    return BuildPlan(BUILDS["cu130"], f"compute capability {shown}: the default CUDA 13.0 build")


def arch_covers(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether a torch build compiled for `arch_list` (torch.cuda.get_arch_list(): 'sm_70', 'compute_90', ...) runs on
    a GPU of `capability`: SASS of the same major and a minor no newer (sm_80 runs on 8.6), or PTX no newer than the
    GPU (the driver compiles it)."""
    major, minor = capability
    for arch in arch_list:
        kind, _, digits = arch.partition("_")
        if not digits.isdigit() or len(digits) < 2:
            continue
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def min_driver_for(torch_cuda: str) -> int | None:
    """The oldest NVIDIA driver (major version) that runs a torch built with CUDA `torch_cuda` ('12.6' -> 525, '13.0'
    -> 580: CUDA's minor-version compatibility covers a major's later minors); None for a CUDA our table lacks."""
    major = torch_cuda.split(".")[0]
    return next((b.min_driver for b in BUILDS.values() if b.cuda and b.cuda.split(".")[0] == major), None)


def build_problem(
    capability: tuple[int, int], arch_list: list[str], torch_cuda: str | None, driver: str | None
) -> str | None:
    """Why this torch cannot run on this GPU (None when it can), as one line with the fix.

    `driver` is the NVIDIA driver version as `nvidia-smi` reports it ('580.65.06'); None or '' when unknown, and
    then the driver is not checked (`running_build_check` says so in a note)."""
    cap = f"{capability[0]}.{capability[1]}"
    fix = plan_build(GpuInventory((capability,)))
    install = f"TORCH_CUDA={fix.build.name} make install ({' '.join(fix.build.pip_command()[1:])})"
    if torch_cuda is None:
        return f"this torch is a CPU build and the node has a GPU of compute capability {cap}: {install}"
    if not arch_covers(capability, arch_list):
        have = " ".join(arch_list) or "none"
        return (
            f"torch {_torch_version()} (CUDA {torch_cuda}) has no kernels for compute capability {cap} (it has: "
            f"{have}); every CUDA kernel would fail with 'no kernel image is available': {install}"
        )
    need = min_driver_for(torch_cuda)
    have_major = GpuInventory((), driver or "").driver_major
    if need is not None and have_major is not None and have_major < need:
        return (
            f"the NVIDIA driver {driver} is older than torch's CUDA {torch_cuda} needs (driver >= {need}): update "
            "the driver, or install the CUDA 12.6 build (TORCH_CUDA=cu126 make install; it needs driver >= 525)"
        )
    return None


def _torch_version() -> str:
    torch = sys.modules.get("torch")
    return getattr(torch, "__version__", "?")


def query_driver(nvidia_smi: str = "nvidia-smi") -> str | None:
    """The NVIDIA driver version from `nvidia-smi --query-gpu=driver_version` (e.g. '580.65.06'), a public and stable
    source; None when nvidia-smi is missing, fails, times out or prints something that is not a version. Never
    raises: the caller treats None as unknown."""
    exe = shutil.which(nvidia_smi)
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else ""
    return first if first.split(".")[0].isdigit() else None


@dataclass(frozen=True)
class BuildCheck:
    """The run-time check of the torch build against this rank's GPU: the problem (None: it runs) and notes on what
    could not be checked."""

    problem: str | None = None
    notes: tuple[str, ...] = ()


DRIVER_UNKNOWN = (
    "the NVIDIA driver version is unknown (nvidia-smi missing, failing or unreadable): the driver check was skipped"
)


def running_build_check(local_rank: int = 0) -> BuildCheck:
    """`build_problem` for the GPU this rank will use and the torch that is running (no problem on a machine without
    a visible CUDA GPU, or when the build covers it). Reads device properties and `nvidia-smi` only: no CUDA context
    is created, no private torch function is called."""
    import torch

    if torch.version.cuda is None or not torch.cuda.is_available():
        if torch.version.cuda is not None and query_driver() is not None:
            return BuildCheck(
                f"nvidia-smi lists GPUs but torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use them: "
                "the driver is likely older than this build needs (CUDA 13 needs driver >= 580): update it or "
                "install the CUDA 12.6 build (TORCH_CUDA=cu126 make install)"
            )
        return BuildCheck()
    props = torch.cuda.get_device_properties(local_rank % torch.cuda.device_count())
    driver = query_driver()
    problem = build_problem((props.major, props.minor), torch.cuda.get_arch_list(), torch.version.cuda, driver)
    return BuildCheck(problem, () if driver else (DRIVER_UNKNOWN,))


def running_build_problem(local_rank: int = 0) -> str | None:
    """`running_build_check(local_rank).problem`."""
    return running_build_check(local_rank).problem


def installed_build(python: str) -> tuple[str, str | None] | None:
    """(torch version, torch.version.cuda) of the torch that `python` imports; None when it has none."""
    probe = "import torch; print(torch.__version__); print(torch.version.cuda)"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except OSError:
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2:
        return None
    return lines[0], None if lines[1] == "None" else lines[1]


class TorchBuildError(UserError):
    """The installed torch cannot run on this node's GPU (refused before any rank starts work)."""


def require_runnable_build(local_rank: int = 0) -> tuple[str, ...]:
    """Raise `TorchBuildError` (one line, with the install command that fixes it) when the build cannot run here;
    else the notes of `running_build_check` (what could not be checked)."""
    check = running_build_check(local_rank)
    if check.problem:
        raise TorchBuildError(check.problem)
    return check.notes
