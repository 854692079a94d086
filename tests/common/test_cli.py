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
