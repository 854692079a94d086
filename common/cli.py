"""The command-line conventions of `python -m data_prep | pretrain | finetune` (written down in docs/layout.md):

- `--output PATH`: where a command writes (a prepared corpus, a run directory, an export, a report);
- `--max-examples N`: a seeded subset of the split a command reads (`--max-train-examples`, `--max-dev-examples`,
  ... where a command reads more than one set);
- booleans are `--x` / `--no-x` (`argparse.BooleanOptionalAction`);
- a flag means one thing in every command (`--device`: where a model runs);
- one way to declare an option: bound to a config dataclass field, `config_argument` (its default, choices and type
  come from the field, so `--help` and the config agree); not bound to one, `add_argument`;
- one way to dispatch: every subcommand is declared with its function (`add_command`), and the `__main__` of each
  package hands its parser to `dispatch`, which runs `args.func(args)` through `run_command`;
- a `UserError` prints `PROG: error: MESSAGE` and exits 2 (`run_command`); an OSError, or a library's exception that
  stands for one (`common.errors.os_error_of`: torch.save's "unexpected pos" on a full disk), one line with the path
  and errno, exit 74; Ctrl-C exits 130 (while the command starts too: `common.interrupts`), SIGTERM 143 where the
  command has no handler of its own, each cleaned up as any failure; `--debug` (or `ELASTICBERT_DEBUG=1`) shows the
  traceback instead;
- the command's outputs are claimed while it runs (`common.claims`, by `common.outputs.check_output`) and given back
  when it ends, however it ends.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import inspect
import os
import shlex
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

from . import claims, interrupts
from .config import field_types, literal_choices, strip_optional
from .errors import (
    EXIT_INTERRUPTED,
    EXIT_OS_ERROR,
    EXIT_TERMINATED,
    Terminated,
    UserError,
    describe_os_error,
    os_error_of,
)


def add_debug(parser: argparse.ArgumentParser) -> None:
    """`--debug`: show the traceback of a user error instead of the one-paragraph message."""
    parser.add_argument(
        "--debug",
        action="store_true",
        default=os.environ.get("ELASTICBERT_DEBUG", "") == "1",
        help="show the full traceback of an error (also ELASTICBERT_DEBUG=1)",
    )


def run_command(prog: str, func: Callable[[], int | None], debug: bool = False, command: str | None = None) -> int:
    """Run a command's body; map user errors, OS errors (read-only, disk full, permission: exit 74) and Ctrl-C to
    their exit codes with one line instead of a traceback (`debug` re-raises, for a bug report). The outputs it
    claims (`common.claims`, recorded as `command`, default the process's command line) are given back when it ends,
    however it ends."""
    interrupts.command_started()
    try:
        with interrupts.terminated_as_exception(), claims.command(prog, command):
            return int(func() or 0)
    except UserError as err:
        if debug:
            raise
        print(f"{prog}: error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    except OSError as err:  # one the command did not turn into a UserError: still one line, with the path and errno
        if debug:
            raise
        mapped = os_error_of(err) or err  # (an errno for numpy's short write, which gives none)
        print(f"{prog}: error: {describe_os_error(mapped)}", file=sys.stderr, flush=True)
        return EXIT_OS_ERROR
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except Terminated:
        print(f"{prog}: terminated (SIGTERM)", file=sys.stderr, flush=True)
        return EXIT_TERMINATED
    except Exception as err:  # a library's own words for an OS error (torch.save, safetensors on a full disk)
        mapped = None if debug else os_error_of(err)
        if mapped is None:
            raise
        print(f"{prog}: error: {describe_os_error(mapped)}", file=sys.stderr, flush=True)
        return EXIT_OS_ERROR


def dispatch(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    prog: str | None = None,
    prepare: Callable[[argparse.Namespace], None] | None = None,
) -> int:
    """Parse `argv` and run the chosen subcommand's `func` through `run_command` (errors printed as `prog`, default
    the parser's); no subcommand prints the help and returns 2. `prepare(args)` runs between parsing and the command
    (what a package sets up once its options are known)."""
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    if prepare is not None:
        prepare(args)
    prog = prog or parser.prog
    command = None if argv is None else shlex.join([prog, *argv])  # None: the process's own command line
    return run_command(prog, lambda: args.func(args), debug=args.debug, command=command)


def exit_without_teardown(code: int) -> None:
    """End the process with `code` as `sys.exit` would (the non-daemon threads joined, the atexit handlers run,
    stdout/stderr flushed), minus the interpreter's finalization: freeing every module and object of torch,
    transformers and DeepSpeed, 1.1-1.4 s of CPU per process here, paid by every rank at the end of every job step
    (16 ranks sharing 2 cores: ~10 s before Slurm sees the step end). For a command whose files are all closed
    when it returns (`python -m pretrain`, `python -m finetune`).

    The threads end as at a normal exit: `threading._shutdown` is the interpreter's own first step of finalization.
    It runs the callbacks registered with `threading._register_atexit` first - `concurrent.futures` stops its
    executors' idle workers there - and then joins the non-daemon threads. Joining them without those callbacks waits
    forever on an executor's idle worker (inductor's compile pool: a compiled run hung at its end)."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    else:  # an interpreter without it: join what is left (an idle executor's workers would still block here)
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def add_command(
    subparsers: argparse._SubParsersAction,
    name: str,
    func: Callable[[argparse.Namespace], int],
    help: str,
    **kwargs: Any,
) -> argparse.ArgumentParser:
    """Subcommand `name`, run as `func(args)` by `dispatch` (its description and epilog shown as written)."""
    parser = subparsers.add_parser(name, help=help, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
    parser.set_defaults(func=func)
    return parser


def call_with_options(func: Callable[..., Any], args: argparse.Namespace, /, **given: Any) -> Any:
    """`func(...)` as a command calls its library function: `given`, and every other parameter of `func` from the
    option of the same name when the command has one (one it has not keeps the function's default)."""
    options = {name: getattr(args, name) for name in inspect.signature(func).parameters if hasattr(args, name)}
    return func(**{**options, **given})


def add_switch(parser: argparse.ArgumentParser | Any, flag: str, default: bool | None, help: str) -> None:
    """A boolean `--x` / `--no-x` not bound to a config field (`default` None: "not said", for a caller to decide)."""
    shown = "" if default is None or "%(default)" in help else " (default: %(default)s)"
    parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help + shown)


def add_output(parser: argparse.ArgumentParser | Any, help: str, required: bool = True, **kwargs: Any) -> None:
    """`--output PATH`: the one name for where a command writes."""
    parser.add_argument("--output", required=required, metavar=kwargs.pop("metavar", "PATH"), help=help, **kwargs)


def add_max_examples(
    parser: argparse.ArgumentParser | Any, which: str = "", help: str | None = None, default: int | None = None
) -> None:
    """`--max-examples N` (or `--max-{which}-examples N`): a seeded random subset, for small CPU runs."""
    flag = f"--max-{which}-examples" if which else "--max-examples"
    parser.add_argument(
        flag,
        type=int,
        default=default,
        metavar="N",
        help=help or f"use a seeded random subset of N {which + ' ' if which else ''}examples",
    )


Device = Literal["auto", "cpu", "cuda"]  # auto: CUDA when available, else the CPU


@dataclasses.dataclass
class _DeviceOption:
    device: Device = "auto"


def add_device(parser: argparse.ArgumentParser | Any, config: type = _DeviceOption, name: str = "device") -> None:
    """`--device auto|cpu|cuda`, the same for every command that runs a model: its choices and default from the
    config field `config.name` (a finetune command passes `TrainConfig`, so `--help` shows its train.device; without
    one, this module's `Device`, default auto)."""
    config_argument(parser, config, name, "--device", help="where the model runs (auto: CUDA when available)")


def default_data_dir() -> str | None:
    """`--data-dir` when not given: $GLUE_DIR when set, else None (the Hugging Face hub)."""
    return os.environ.get("GLUE_DIR") or None


def add_data_dir(parser: argparse.ArgumentParser | Any) -> None:
    """`--data-dir`, the same for every command that reads GLUE/ELUE data."""
    parser.add_argument(
        "--data-dir",
        default=default_data_dir(),
        help="GLUE/ELUE data root or one task's folder; hf:NAME reads GLUE from the Hugging Face hub "
        "(default: $GLUE_DIR when set, else the hub)",
    )


def add_threads(
    parser: argparse.ArgumentParser | Any, default: int | None = None, help: str = "torch intra-op threads"
) -> None:
    """`--threads N`: how many threads a command computes with (`default` None: the library's own choice)."""
    shown = "" if default is None or "%(default)" in help or "default" in help else " (default: %(default)s)"
    parser.add_argument("--threads", type=int, default=default, metavar="N", help=help + shown)


def config_argument(
    parser: argparse.ArgumentParser | Any,
    cls: type,
    name: str,
    *flags: str,
    help: str | None = None,
    shortcut: bool = False,
    **overrides: Any,
) -> argparse.Action:
    """An option for dataclass field `cls.name` (`name` may be dotted through nested sections: `optim.lr`): its
    default, its `Literal` choices, its type; booleans become `--x/--no-x`. A `shortcut` stands for one config key
    (dest = the dotted key) and is absent from the parsed namespace unless given, so that it overrides a config file
    only when the user wrote it; `--help` still shows the config's default. `overrides` go to `add_argument`."""
    owner, field_name = _owner_of(cls, name)
    field = {f.name: f for f in dataclasses.fields(owner)}[field_name]
    tp, _ = strip_optional(field_types(owner)[field_name])
    if field.default is not dataclasses.MISSING:
        default = field.default
    elif field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    else:
        default = None
    kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS if shortcut else default}
    choices = literal_choices(tp)
    if choices is not None:
        kwargs.update(choices=choices, type=type(choices[0]))
    elif tp is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif tp in (int, float, str):
        kwargs["type"] = tp
    kwargs.update(overrides)
    if help is not None:
        shown = "" if default is None or default == "" else f" (default: {default})"
        kwargs["help"] = help if "%(default)" in help else help + shown.replace("%", "%%")
    return parser.add_argument(*(flags or (f"--{field_name.replace('_', '-')}",)), **kwargs)


def _owner_of(cls: type, dotted: str) -> tuple[type, str]:
    """The dataclass that declares the last part of `dotted`, and that part."""
    *sections, name = dotted.split(".")
    for section in sections:
        cls = strip_optional(field_types(cls)[section])[0]
    return cls, name


def given_config_keys(args: argparse.Namespace) -> dict[str, Any]:
    """The config keys the command line gave through shortcuts (`config_argument(..., shortcut=True)`)."""
    return {key: value for key, value in vars(args).items() if "." in key}
