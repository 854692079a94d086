"""A real Slurm cluster on this box for tests marked ``@pytest.mark.slurm`` (see local_cluster.sh): the host's own
node (partition ``debug``, the default) and eight compute nodes ebnode1..8 in their own network, UTS and mount
namespaces (partition ``scale``: all eight; ``multi``: ebnode1/ebnode2; distinct host names and addresses, ranks talk
over a veth/bridge network; ``SlurmCluster.node_mount`` changes what one node sees).

The session fixture ``slurm_cluster`` starts the cluster once (installing the Debian packages if missing), and stops
it at the end only if a pytest session started it and no other pytest session still uses it (a shared flock on
RUN_DIR/pytest.lock is held while a session uses the cluster). As root, a cluster that cannot be started FAILS the
tests with the daemons' logs. As another user (a workstation without sudo) the tests skip with a [needs-slurm]
reason unless a cluster already runs; in CI (`CI=true`) such a skip fails the run (tests/conftest.py).

Also shared here: the tokenised tiny corpus and the single-node reference pre-training run (``tiny_corpus``,
``reference_run``: session fixtures) that the single- and the multi-node tests compare against (pretrain_runs.py).
"""

import contextlib
import fcntl
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # pretrain_runs.py (the tests run with --import-mode=importlib)

import pretrain_runs  # noqa: E402

CLUSTER_SH = HERE / "local_cluster.sh"
RUN_DIR = Path(os.environ.get("SLURM_LOCAL_RUN_DIR", "/tmp/elasticbert-slurm"))
OWNER_MARK = RUN_DIR / "started-by-pytest"
# DeepSpeed JIT-builds its CPU shm op into TORCH_EXTENSIONS_DIR with whatever `ninja` is first on PATH: in the jobs
# the venv's (common.sh activates the venv; pip's ninja 1.13), in runs that call .venv/bin/python without activating
# it Debian's 1.11. Each discards the other's build log ("build log version is too old; starting over") and rebuilds
# the op (~30 s, minutes on a loaded box) at every job start that follows such a run. The test jobs get their own.
TORCH_EXTENSIONS = RUN_DIR / "torch_extensions"
JOB_LOOK_S, ENDED_GRACE_S = 5.0, 60.0  # wait_until: how often it asks for the job's state; how long "ended" must last
MULTI_PARTITION = "multi"
MULTI_NODES = ("ebnode1", "ebnode2")
FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


def _sh(*args: str, timeout: float = 60, check: bool = False, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=check, **kw)


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError as e:
        return f"<{e}>"


# the scripts' knobs: never inherited from the developer's shell by a test submission
KNOBS = [
    "EB_ROOT",
    "EB_VENV",
    "EB_PYTHON",
    "EB_SIGNALS",
    "EB_MAX_RESTARTS",
    "EB_RANK_LOGS",
    "EB_LOG_DIR",
    "EB_SRUN_ARGS",
    "EB_MASTER_ADDR",
    "EB_MASTER_PORT",
    "EB_REQUEUE_ON_SIGNAL",
    "EB_STEP_WAIT",
    "CONFIG",
    "DS_CONFIG",
    "RUN_DIR",
    "PRETRAIN_MODULE",
    "DATA_PREP_MODULE",
    "FINETUNE_MODULE",
    "FT_OUT",
    "MODEL",
    "DATA_DIR",
    "PREP_TASKS",
    "PREP_NUM_TASKS",
    "TASKS",
    "SEEDS",
    "OMP_NUM_THREADS",
    "DS_ACCELERATOR",
    "VIRTUAL_ENV",
    "ELASTICBERT_DATA",
    "PYTHONPATH",
    "STANDIN_MODE",
    "STANDIN_PREFLIGHT",
    "EB_PREFLIGHT",
    "STANDIN_FAIL_INDEX",
    "TORCH_EXTENSIONS_DIR",
]


class SlurmCluster:
    """Small helpers around sbatch/scontrol for the tests."""

    @staticmethod
    def env(**extra) -> dict:
        """A complete environment for a submission (sbatch exports it to the job): none of the scripts' knobs
        inherited from the developer's shell, misleading MASTER_ADDR/PORT (the scripts must derive their own), and
        ``extra`` (str()-ed)."""
        env = {k: v for k, v in os.environ.items() if k not in KNOBS}
        env.update({"MASTER_ADDR": "bogus", "MASTER_PORT": "1", "TORCH_EXTENSIONS_DIR": str(TORCH_EXTENSIONS)})
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def sbatch(self, *args: str, env: dict | None = None, cwd: Path | str = REPO) -> str:
        """Submit; ``env`` is the complete environment (sbatch exports it to the job)."""
        r = _sh("sbatch", "--parsable", *map(str, args), env=os.environ if env is None else env, cwd=str(cwd))
        assert r.returncode == 0, f"sbatch {' '.join(map(str, args))} failed:\n{r.stdout}{r.stderr}"
        return r.stdout.strip().split(";")[0]

    @staticmethod
    def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """A Slurm client command (scancel, scontrol ...), output captured."""
        return _sh(*map(str, args), timeout=timeout)

    @staticmethod
    def node_processes(node: str) -> dict[int, str]:
        """pid -> command name of every process in NODE's network namespace (its slurmd and what it started)."""
        r = _sh("ip", "netns", "pids", node)
        procs = {}
        for pid in r.stdout.split():
            try:
                procs[int(pid)] = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                pass  # gone meanwhile
        return procs

    @contextlib.contextmanager
    def node_mount(self, node: str, target: Path, options: str = "size=1m"):
        """A tmpfs mounted at `target` as NODE alone sees it (its slurmd's mount namespace, which the job's tasks
        on that node inherit): an empty folder where the data should be, or a nearly full disk. Unmounted after."""
        slurmd = [pid for pid, comm in self.node_processes(node).items() if comm == "slurmd"]
        assert slurmd, f"no slurmd in {node}'s namespace"
        enter = ["nsenter", "-t", str(slurmd[0]), "-m", "--"]
        r = _sh(*enter, "mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target))
        assert r.returncode == 0, f"mount on {node}: {r.stderr}"
        try:
            yield
        finally:
            _sh(*enter, "umount", "-l", str(target))

    def set_node_state(self, node: str, state: str, reason: str = "elasticbert test") -> None:
        extra = [f"Reason={reason}"] if state.upper() in ("DRAIN", "DOWN") else []
        r = self.run("scontrol", "update", f"NodeName={node}", f"State={state}", *extra)
        assert r.returncode == 0, f"scontrol update NodeName={node} State={state}: {r.stderr}"

    def jobs(self, job_id: str) -> list[dict]:
        """One dict per job record (an array gives one per task, pending tasks may still be one record)."""
        r = _sh("scontrol", "show", "job", "-o", str(job_id))
        if r.returncode != 0:
            return []
        return [dict(re.findall(r"(\w+(?:/\w+)?)=(\S*)", line)) for line in r.stdout.splitlines() if line.strip()]

    def job(self, job_id: str) -> dict:
        recs = self.jobs(job_id)
        assert len(recs) == 1, f"expected one record for {job_id}, got {recs}"
        return recs[0]

    def wait_until(self, what: str, pred, timeout: float, job_id: str | None = None, poll: float = 0.3):
        """`pred()` once true, polled every `poll` s; fails after `timeout`, or as soon as job `job_id` has sat in a
        final state other than PREEMPTED (a preempted job comes back requeued) for ENDED_GRACE_S without it: a job
        that failed on its own must not hold the suite for the whole timeout (20 min once)."""
        end = time.monotonic() + timeout
        next_look, ended_since = time.monotonic() + JOB_LOOK_S, None
        while True:
            v = pred()
            if v:
                return v
            now = time.monotonic()
            if now > end:
                pytest.fail(f"timeout ({timeout}s) waiting for {what}\n{self.diagnose(job_id)}", pytrace=False)
            if job_id is not None and now >= next_look:
                next_look = now + JOB_LOOK_S
                recs = self.jobs(job_id)
                ended = len(recs) == 1 and recs[0].get("JobState") in FINAL_STATES - {"PREEMPTED"}
                ended_since = (ended_since or now) if ended else None
                if ended_since is not None and now - ended_since >= ENDED_GRACE_S:
                    state = recs[0].get("JobState")
                    pytest.fail(f"job {job_id} ended {state} before {what}\n{self.diagnose(job_id)}", pytrace=False)
            time.sleep(poll)

    def wait_state(self, job_id: str, states: set | str, timeout: float = 60) -> dict:
        states = {states} if isinstance(states, str) else set(states)

        def done() -> dict | None:
            recs = self.jobs(job_id)
            if len(recs) == 1 and recs[0].get("JobState") in states:
                return recs[0]
            if len(recs) == 1 and recs[0].get("JobState") in FINAL_STATES - states:
                pytest.fail(
                    f"job {job_id} ended {recs[0].get('JobState')}, wanted {states}\n{self.diagnose(job_id)}",
                    pytrace=False,
                )
            return None

        return self.wait_until(f"job {job_id} to reach {states}", done, timeout, job_id)

    def wait_array_final(self, job_id: str, n_tasks: int, timeout: float = 90) -> dict[int, dict]:
        def done() -> dict | None:
            recs = self.jobs(job_id)
            by_task = {int(r["ArrayTaskId"]): r for r in recs if r.get("ArrayTaskId", "").isdigit()}
            if len(by_task) == n_tasks and all(r["JobState"] in FINAL_STATES for r in by_task.values()):
                return by_task
            return None

        return self.wait_until(f"array {job_id} ({n_tasks} tasks) to finish", done, timeout, job_id)

    def diagnose(self, job_id: str | None = None) -> str:
        parts = []
        if job_id:
            recs = self.jobs(job_id)
            parts.append(f"---- scontrol show job {job_id}\n" + "\n".join(map(str, recs)))
            for rec in recs:
                if rec.get("StdOut"):
                    parts.append(f"---- {rec['StdOut']}\n{_tail(Path(rec['StdOut']))}")
        parts.append("---- squeue\n" + _sh("squeue").stdout)
        parts.append("---- slurmctld.log\n" + _tail(Path("/var/log/slurm/slurmctld.log"), 20))
        for log in sorted(Path("/var/log/slurm").glob("slurmd-*.log")):
            parts.append(f"---- {log.name}\n" + _tail(log, 15))
        return "\n".join(parts)


def _skip_unless_startable() -> None:
    """Root starts (and if needed installs) the local cluster; anyone else can only use one that already runs."""
    if os.geteuid() == 0 or _sh("bash", str(CLUSTER_SH), "status").returncode == 0:
        return
    pytest.skip(
        "[needs-slurm] the local test cluster needs root (slurmd runs as root; the harness installs Slurm when "
        "missing): run `sudo -E make test`, or start it once with `sudo bash tests/slurm/local_cluster.sh start`"
    )


@pytest.fixture(scope="session")
def slurm_cluster():
    _skip_unless_startable()
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    lock = open(RUN_DIR / "pytest.lock", "a+")  # held for the whole session
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        was_up = _sh("bash", str(CLUSTER_SH), "status").returncode == 0
        r = _sh("bash", str(CLUSTER_SH), "start", timeout=900)  # idempotent; also checks slurm.conf is ours
        if r.returncode != 0:
            if not was_up:  # stop what this attempt did start (only recorded daemons)
                _sh("bash", str(CLUSTER_SH), "stop", timeout=120)
            pytest.fail(
                f"could not start the local Slurm cluster ({CLUSTER_SH} start, exit {r.returncode}):\n"
                f"{r.stdout}\n{r.stderr}",
                pytrace=False,
            )
        if not was_up:
            OWNER_MARK.touch()
    finally:
        fcntl.flock(lock, fcntl.LOCK_SH)  # other pytest sessions may share the cluster now
    yield SlurmCluster()
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the last session using it...
    except BlockingIOError:
        return
    try:
        if OWNER_MARK.exists():  # ...stops it if a pytest session started it
            r = _sh("bash", str(CLUSTER_SH), "stop", timeout=120)
            OWNER_MARK.unlink(missing_ok=True)
            assert r.returncode == 0, f"{CLUSTER_SH} stop failed:\n{r.stdout}{r.stderr}"
    finally:
        lock.close()


@pytest.fixture(autouse=True)
def _slurm_marked(request):
    """Tests marked @pytest.mark.slurm get the cluster even if they do not ask for the fixture."""
    if request.node.get_closest_marker("slurm"):
        request.getfixturevalue("slurm_cluster")


@pytest.fixture(scope="session")
def multi_nodes(slurm_cluster) -> tuple[str, ...]:
    """The namespace nodes of partition `multi`, idle (FAILS if the harness did not make them: it does as root)."""
    r = _sh("sinfo", "-h", "-N", "-p", MULTI_PARTITION, "-o", "%N %T")
    states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
    if sorted(states) != sorted(MULTI_NODES) or not all(s in ("idle", "mixed") for s in states.values()):
        pytest.fail(f"partition {MULTI_PARTITION} should hold idle {MULTI_NODES}, sinfo says {states or r.stderr}")
    return MULTI_NODES


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """Three Gutenberg books tokenised once for every real pre-training run of the session."""
    return pretrain_runs.tokenize_books(tmp_path_factory.mktemp("corpus") / "gutenberg")


@pytest.fixture(scope="session")
def reference_run(slurm_cluster, tiny_corpus, tmp_path_factory) -> tuple[dict, Path]:
    """pretrain_base.sh with the tiny CPU config on ONE node x 2 ranks, uninterrupted: what the resumed and the
    multi-node runs must reproduce step for step."""
    run_dir = tmp_path_factory.mktemp("pretrain") / "reference"
    jid = pretrain_runs.submit_pretrain(slurm_cluster, run_dir, tiny_corpus, pretrain_runs.ONE_NODE)
    return slurm_cluster.wait_state(jid, "COMPLETED", timeout=600), run_dir
