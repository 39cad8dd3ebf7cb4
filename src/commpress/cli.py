"""The ``commpress`` command line."""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import platform
import select
import signal
import sys
from collections.abc import Iterable
from importlib import metadata

from commpress.cluster.launcher import TIMEOUT_EXIT_CODE
from commpress.cluster.system import ClusterError, DistributedError, DistributedTimeoutError

#: name -> (help, module, the module's function that adds the arguments, handler or None
#: where that function sets its own). A command's module is imported only when it runs:
#: ``commpress cluster`` and ``commpress launch`` do not wait for torch to import.
COMMANDS = {
    "codecs": (
        "benchmark every codec: ratio, error, encode/decode GB/s vs memcpy",
        "commpress.bench.codecs",
        "add_arguments",
        "main",
    ),
    "bench": (
        "nccl-tests-style sweep: compressed collectives vs torch.distributed",
        "commpress.bench.collectives",
        "add_arguments",
        "main",
    ),
    "schedule": (
        "print an algorithm's steps, rank by rank, without running it",
        "commpress.bench.schedule_command",
        "add_arguments",
        "run",
    ),
    "sim": (
        "cost model on the schedules: time and traffic at up to thousands of nodes",
        "commpress.bench.sim_command",
        "add_arguments",
        "main",
    ),
    "cluster": (
        "emulated cluster: hosts in network namespaces behind rate-limited links",
        "commpress.cluster.commands",
        "add_cluster_arguments",
        None,
    ),
    "launch": (
        "run a command as a multi-node job on the emulated cluster",
        "commpress.cluster.commands",
        "add_launch_arguments",
        None,
    ),
    "train": (
        "train a small GPT on the stdlib's source, with and without compression",
        "commpress.train.command",
        "add_arguments",
        "main",
    ),
}

EXIT_STATUSES = """\
exit status:
  0    done
  1    a rank failed, or the emulated cluster could not be built or used
  2    a bad option or value (a usage error)
  124  --timeout passed: every rank was stopped
  130  Ctrl-C, SIGTERM or a hang-up: every rank was stopped
  141  the reader of the output went away (`commpress ... | head`)
  launch: the job's worst exit status; 127 (126) for a command that cannot be found (run)"""


class _Parser(argparse.ArgumentParser):
    """argparse's parser that names a misspelt option, and names it first: ``--algoritm
    ring`` is reported as unrecognized by the command's parser, with the option meant, not
    as a missing ``--algorithm`` (or by the top-level parser, which knows no options)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._words: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        self._words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        unknown = self._unknown_options()
        if unknown and message.startswith("the following arguments are required"):
            message = f"unrecognized arguments: {' '.join(unknown)}"
        if message.startswith("unrecognized arguments"):
            command = self._command()
            if command is not None:  # the words were the command's: it says so
                command.error(message)
            message += "".join(self._meant(word) for word in unknown)
        super().error(message)

    def _command(self) -> _Parser | None:
        """The parser of the (sub)command named in this parser's words, if it has any."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return next((action.choices[w] for w in self._words if w in action.choices), None)
        return None

    def _long_options(self) -> list[str]:
        return [name for name in self._option_string_actions if name.startswith("--")]

    def _unknown_options(self) -> list[str]:
        """The words before ``--`` that look like options this parser neither knows nor
        abbreviates uniquely (as argparse allows)."""
        words = self._words[: self._words.index("--")] if "--" in self._words else self._words
        unknown = []
        for word in words:
            name = word.split("=", 1)[0]
            if not name.startswith("--") or name in self._option_string_actions:
                continue
            if len([option for option in self._long_options() if option.startswith(name)]) != 1:
                unknown.append(name)
        return unknown

    def _meant(self, word: str) -> str:
        close = difflib.get_close_matches(word, self._long_options(), n=1, cutoff=0.75)
        return f" (did you mean {close[0]}?)" if close else ""


def build_parser(loaded: Iterable[str]) -> argparse.ArgumentParser:
    """The parser; only the commands named in ``loaded`` get their arguments (and handlers)."""
    loaded = set(loaded)
    parser = _Parser(
        prog="commpress",
        description="Cheaper communication for distributed PyTorch training.",
        epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_versions())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, module_name, add_arguments, handler) in COMMANDS.items():
        command = commands.add_parser(name, help=help_text)
        if name in loaded:
            module = importlib.import_module(module_name)
            getattr(module, add_arguments)(command)
            if handler is not None:
                command.set_defaults(handler=getattr(module, handler))
    return parser


def _versions() -> str:
    """commpress's version and torch's, as installed (read without importing torch)."""
    installed = []
    for package in ("commpress", "torch"):
        try:
            installed.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            installed.append(f"{package} (not installed)")
    return f"{', '.join(installed)}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # the top-level options take no value (--help, --version): the first word that is not
    # an option names the command (an unknown word loads nothing, and argparse reports it)
    named = next((word for word in argv if not word.startswith("-")), None)
    try:
        parser = build_parser([named])
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] == "commpress":
            raise  # a defect of ours, with its traceback
        print(f"commpress {named}: error: {error} (a dependency of this command)", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # a killed command still cleans up
    # Ctrl-C even where the shell started us with SIGINT ignored (a background job)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _check_outputs_differ(args)
        status = args.handler(args)
        if status and _stdout_reader_gone():  # a failed job whose output's reader left
            _discard_stdout()
        sys.stdout.flush()  # here, not at exit, where a reader gone is beyond our handling
        return status
    except (ValueError, TypeError, ImportError) as error:
        print(f"{_command_name(args)}: error: {error}", file=sys.stderr)
        return 2
    except DistributedTimeoutError as error:
        print(f"{_command_name(args)}: {error}", file=sys.stderr)
        return TIMEOUT_EXIT_CODE
    except (ClusterError, DistributedError) as error:  # a rank's traceback is in the message
        print(f"{_command_name(args)}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{_command_name(args)}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # another pipe: a defect or a dead peer, with its traceback
        # the reader stopped reading (`commpress schedule ... | head`): end quietly
        _discard_stdout()
        return 128 + signal.SIGPIPE


#: Options that name a file a command writes.
OUTPUT_OPTIONS = ("json", "markdown", "plot", "save_fit")
#: Options that name files a command reads (one path, or a list of them).
INPUT_OPTIONS = ("calibrate", "fit", "codec_speeds", "tune_fit")


def _check_outputs_differ(args) -> None:
    """ValueError where two outputs name one file (``--json r --markdown r``), or an output
    names a file the command reads (``--calibrate b.json --save-fit b.json``): the second
    written would replace the first, or the output the measurements it was made from."""
    seen = {}
    for name in INPUT_OPTIONS:
        paths = getattr(args, name, None) or []
        for path in [paths] if isinstance(paths, str) else paths:
            seen.setdefault(os.path.realpath(path), name)
    for name in OUTPUT_OPTIONS:
        path = getattr(args, name, None)
        if not path:
            continue
        first = seen.setdefault(os.path.realpath(path), name)
        if first in INPUT_OPTIONS:
            raise ValueError(
                f"--{_option(name)} names {path!r}, which --{_option(first)} reads: "
                "writing it would replace what the command reads"
            )
        if first != name:
            options = f"--{_option(first)} and --{_option(name)}"
            raise ValueError(f"{options} name the same file, {path!r}: one would replace the other")


def _command_name(args) -> str:
    """``commpress cluster up``, as argparse names the command in its own errors."""
    return " ".join(["commpress", args.command, *filter(None, [getattr(args, "action", None)])])


def _option(name: str) -> str:
    return name.replace("_", "-")


def _discard_stdout() -> None:
    """Standard output to /dev/null: no BrokenPipeError when Python flushes it at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _stdout_reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (poll reports an error)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (OSError, ValueError):
        return False


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
