"""The error convention every command shares: a user error is one message and exit 2; --debug shows the traceback."""

from __future__ import annotations

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
