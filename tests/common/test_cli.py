"""The error convention every command shares: a user error is one message and exit 2; --debug shows the traceback."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from common.cli import run_command
from common.errors import EXIT_USER_ERROR, ConfigError, UserError


def failing() -> int:
    raise ConfigError(["a.b: expected an integer, got 'x'", "c: unknown key"], source="run.yaml")


def test_a_user_error_is_a_message_and_exit_2(capsys):
    assert run_command("prog", failing) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith("prog: error: invalid run.yaml:\n  - a.b: expected an integer") and "Traceback" not in err


def test_debug_re_raises(capsys):
    with pytest.raises(UserError):
        run_command("prog", failing, debug=True)


@pytest.mark.parametrize("module", ["data_prep", "pretrain", "finetune"])
def test_every_cli_takes_debug_and_hides_tracebacks_without_it(module, tmp_path):
    missing = str(tmp_path / "missing")
    argv = {
        "data_prep": ["finalize", missing],
        "pretrain": ["check-config", "--config", missing],
        "finetune": ["evaluate", "--model", missing, "--output", str(tmp_path / "out")],
    }[module]
    quiet = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=120)
    assert quiet.returncode == EXIT_USER_ERROR, quiet.stderr
    assert quiet.stderr.startswith(f"{module}: error: ") and "Traceback" not in quiet.stderr and missing in quiet.stderr
    loud = subprocess.run([sys.executable, "-m", module, "--debug", *argv], capture_output=True, text=True, timeout=120)
    assert loud.returncode != 0 and "Traceback (most recent call last)" in loud.stderr


def _parser(required: bool = False):
    import argparse

    from common.cli import add_debug

    parser = argparse.ArgumentParser(prog="prog")
    add_debug(parser)
    sub = parser.add_subparsers(dest="command", required=required)
    sub.add_parser("ok").set_defaults(func=lambda args: 0)
    sub.add_parser("fail").set_defaults(func=lambda args: failing())
    return parser


def test_dispatch_runs_the_subcommands_func_through_run_command(capsys):
    from common.cli import dispatch

    seen = []
    assert dispatch(_parser(), ["ok"], prepare=lambda args: seen.append(args.command)) == 0 and seen == ["ok"]
    assert dispatch(_parser(), ["fail"], prog="other") == EXIT_USER_ERROR
    assert capsys.readouterr().err.startswith("other: error: invalid run.yaml:")
    with pytest.raises(UserError):
        dispatch(_parser(), ["--debug", "fail"])


def test_dispatch_without_a_command_prints_the_help_and_returns_2(capsys):
    from common.cli import dispatch

    assert dispatch(_parser(), []) == 2 and "usage: prog" in capsys.readouterr().out
    with pytest.raises(SystemExit) as err:  # a required command: argparse's own error, exit 2
        dispatch(_parser(required=True), [])
    assert err.value.code == 2


EXITING_WITH_AN_IDLE_EXECUTOR = """
import concurrent.futures, sys, threading, time
from common.cli import exit_without_teardown
pool = concurrent.futures.ThreadPoolExecutor(2)  # left open, as inductor leaves its compile pool
pool.submit(time.sleep, 0).result()
def late_write():
    time.sleep(0.3)
    open(sys.argv[1], "w").write("written")
threading.Thread(target=late_write).start()  # a non-daemon thread still working
exit_without_teardown(3)
"""


def test_exit_without_teardown_ends_like_a_normal_exit_with_an_executor_left_open(tmp_path):
    """The exit code, the non-daemon thread's work finished, and no hang on an executor's idle workers (joining the
    threads without `threading`'s exit callbacks waited for them forever: a compiled pre-training run hung there)."""
    marker = tmp_path / "marker"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run(
        [sys.executable, "-c", EXITING_WITH_AN_IDLE_EXECUTOR, str(marker)], cwd=repo, timeout=60, capture_output=True
    )
    assert done.returncode == 3, done.stderr.decode()
    assert marker.read_text() == "written"


def test_an_os_error_no_command_handled_is_one_line_with_path_and_errno(capsys, tmp_path):
    """The shared entry turns an OSError that reached it (read-only output, full disk, a file where a folder is
    expected) into one line naming the path and errno, exit 74 (EX_IOERR) — never a traceback."""
    import errno
    import os

    from common.errors import EXIT_OS_ERROR

    blocker = tmp_path / "file"
    blocker.write_text("x")

    def make_folder_below_a_file():
        (blocker / "out").mkdir()

    assert run_command("finetune", make_folder_below_a_file) == EXIT_OS_ERROR == 74
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"finetune: error: {blocker / 'out'}: Not a directory (ENOTDIR: a file stands where a folder" in err

    def full_disk():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "x.bin"))

    assert run_command("pretrain", full_disk) == 74
    assert "x.bin: No space left on device (ENOSPC: the disk is full)" in capsys.readouterr().err
    with pytest.raises(OSError):
        run_command("pretrain", full_disk, debug=True)


def test_temporaries_of_dead_writers_are_removed_by_the_next_write(tmp_path):
    """A killed export or save leaves `.NAME.tmpPID`; the next atomic write of NAME removes it when that process is
    gone, and keeps a live writer's."""
    import subprocess as sp

    from common.io import atomic_write_text, temporary_sibling

    target = tmp_path / "export"
    dead = sp.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".export.tmp{int(dead.stdout)}"
    (stale / "sub").mkdir(parents=True)
    live = tmp_path / f".export.tmp{os.getppid()}"  # this test's parent: alive
    live.mkdir()
    other = tmp_path / ".other.tmp1"  # another path's temporary is not ours to judge
    other.mkdir()
    atomic_write_text(target, "done")
    assert target.read_text() == "done"
    assert not stale.exists() and live.exists() and other.exists()
    assert not temporary_sibling(target).exists()


def test_an_atomic_write_on_a_read_only_filesystem_names_the_file(tmp_path):
    """The pre-clean of the temporary does not fail first (it used to on a read-only filesystem): the OSError that
    comes out is the write's, EROFS, naming the file."""
    from faults import small_tmpfs

    from common.io import atomic_write_text

    with small_tmpfs(tmp_path / "ro", read_only=True) as folder:
        with pytest.raises(OSError) as err:
            atomic_write_text(folder / "a.json", "{}")
        assert err.value.errno == errno.EROFS and err.value.filename == str(folder / "a.json")


# ------------------------------------------------------------- issue 38, class 5: every write path knows its file


def _text_write(path):
    with open(path, "w", encoding="utf-8") as handle:  # buffered: the failure may come at write() or at close()
        handle.write("x" * 2_000_000)


def test_a_failed_write_inside_atomic_path_is_an_os_error_naming_the_file(tmp_path):
    """torch.save's "unexpected pos N vs M", safetensors' "I/O error ... (os error 28)" and a plain write()/close()
    that names no file all come out of `atomic_path` as OSError(ENOSPC) naming the file the caller asked for (not
    its temporary), and leave nothing behind."""
    import torch
    from faults import small_tmpfs
    from safetensors.torch import save_file

    from common.io import atomic_path, writing

    state = {"w": torch.zeros(300_000)}
    writers = {
        "a.bin": lambda path: torch.save(state, path),
        "b.safetensors": lambda path: save_file(state, str(path)),
        "c.txt": _text_write,
    }
    with small_tmpfs(tmp_path / "small", "512k") as small:
        for name, write in writers.items():
            with pytest.raises(OSError) as err:
                with atomic_path(small / name) as tmp:
                    write(tmp)
            assert err.value.errno == errno.ENOSPC and err.value.filename == str(small / name), (name, err.value)
            assert list(small.iterdir()) == [], name
        with pytest.raises(OSError) as err:  # a library writing by path, outside atomic_path
            with writing(small / "d.bin"):
                torch.save(state, small / "d.bin")
        assert err.value.errno == errno.ENOSPC and err.value.filename == str(small / "d.bin")


def test_run_command_reports_a_libraries_disk_full_as_an_os_error(capsys):
    """An exception that stands for an OSError (a library's own words) reaching the shared entry is one line with
    errno, exit 74; any other exception is a bug and keeps its traceback."""
    from common.errors import EXIT_OS_ERROR

    def safetensors_full():
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    assert run_command("finetune", safetensors_full) == EXIT_OS_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device (ENOSPC: the disk is full)" in err

    def bug():
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_command("finetune", bug)


def test_removed_on_failure_takes_back_what_a_failed_block_created(tmp_path):
    """A failed command leaves no folder it made (with the parents it needed) and no file it created; what was
    there before stays; a block that succeeds keeps everything."""
    from common.io import removed_on_failure

    new = tmp_path / "a" / "b"
    with pytest.raises(ValueError):
        with removed_on_failure(new) as folder:
            folder.mkdir(parents=True)
            (folder / "x.json").write_text("{}")
            raise ValueError("failed")
    assert not (tmp_path / "a").exists()
    old = tmp_path / "old"
    (old / "kept").mkdir(parents=True)
    (old / "kept" / "earlier.tsv").write_text("k")
    with pytest.raises(ValueError):
        with removed_on_failure(old):
            (old / "kept" / "new.tsv").write_text("n")
            (old / "sub" / "deep").mkdir(parents=True)
            (old / "sub" / "deep" / "y").write_text("y")
            raise ValueError("failed")
    assert sorted(str(p.relative_to(old)) for p in old.rglob("*")) == ["kept", "kept/earlier.tsv"]
    with removed_on_failure(tmp_path / "ok") as folder:
        folder.mkdir()
        (folder / "f").write_text("f")
    assert (tmp_path / "ok" / "f").read_text() == "f"


def test_a_temporary_that_keeps_its_suffix_is_still_cleaned_up(tmp_path):
    """`keep_suffix` (matplotlib picks the format by the suffix): `.NAME.tmpPID.png`, removed when its writer died."""
    import subprocess as sp

    from common.io import atomic_path, temporary_sibling

    target = tmp_path / "curve.png"
    assert temporary_sibling(target, keep_suffix=True).name == f".curve.png.tmp{os.getpid()}.png"
    dead = int(sp.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    stale = tmp_path / f".curve.png.tmp{dead}.png"
    stale.write_bytes(b"half")
    with atomic_path(target, keep_suffix=True) as tmp:
        assert tmp.suffix == ".png"
        tmp.write_bytes(b"png")
    assert target.read_bytes() == b"png" and not stale.exists()


def test_make_dirs_names_the_file_that_stands_where_a_folder_is_expected(tmp_path):
    """`Path.mkdir(parents=True, exist_ok=True)` says "File exists" about the folder it was asked for when a file has
    that name, and names the asked-for folder when a file is above it; `make_dirs` names the file in both."""
    from common.io import make_dirs

    blocker = tmp_path / "file"
    blocker.write_text("x")
    for wanted in (blocker, blocker / "a" / "b"):
        with pytest.raises(NotADirectoryError) as err:
            make_dirs(wanted)
        assert err.value.errno == errno.ENOTDIR and err.value.filename == str(blocker)
    assert make_dirs(tmp_path / "c" / "d").is_dir()


def test_write_all_never_drops_the_tail_of_a_short_write(tmp_path):
    """An unbuffered file's write() on a filling disk writes what fits and returns the count (a text wrapper over it
    drops the rest silently); `write_all` writes the rest or raises ENOSPC naming the file it is given."""
    from faults import small_tmpfs

    from common.io import write_all

    with small_tmpfs(tmp_path / "small", "64k") as small:
        with open(small / "out", "wb", buffering=0) as raw:
            assert raw.write(b"x" * 100_000) == 65536  # the short write itself, as the kernel gives it
        (small / "out").unlink()
        with open(small / "out", "wb", buffering=0) as raw, pytest.raises(OSError) as err:
            write_all(raw, b"x" * 100_000, "<stdout>")
        assert err.value.errno == errno.ENOSPC and err.value.filename == "<stdout>"


def test_shared_options_parse_the_same_everywhere(monkeypatch):
    import argparse
    import dataclasses
    import typing

    from common.cli import Device, add_data_dir, add_device, add_threads
    from finetune.config import TrainConfig

    monkeypatch.setenv("GLUE_DIR", "/data/glue")
    parser = argparse.ArgumentParser()
    add_device(parser)
    add_data_dir(parser)
    add_threads(parser, default=3)
    assert vars(parser.parse_args([])) == {"device": "auto", "data_dir": "/data/glue", "threads": 3}
    assert parser.parse_args(["--device", "cpu", "--threads", "1"]).device == "cpu"
    with pytest.raises(SystemExit):
        parser.parse_args(["--device", "tpu"])
    # finetune's train.device is the same option: the same choices and default
    field = {f.name: f for f in dataclasses.fields(TrainConfig)}["device"]
    assert typing.get_args(typing.get_type_hints(TrainConfig)["device"]) == typing.get_args(Device)
    assert field.default == "auto"


def test_call_with_options_passes_the_options_of_the_same_name():
    import argparse

    from common.cli import call_with_options

    def library(model_dir, data_dir=None, batch_size=64, device="auto"):
        return model_dir, data_dir, batch_size, device

    args = argparse.Namespace(model="m", data_dir="d", device="cpu", func=print, debug=False)
    assert call_with_options(library, args, model_dir=args.model) == ("m", "d", 64, "cpu")  # no --batch-size: default
    assert call_with_options(library, args, model_dir="x", device="cuda") == ("x", "d", 64, "cuda")  # given wins
