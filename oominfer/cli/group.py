"""The ``oominfer`` command group: its help, and expected failures shown as one message and an
exit code (the codes and their meanings: ``EXIT_CODES`` in oominfer/base/errors.py)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import traceback
from collections.abc import Sequence
from typing import Any, Final, NoReturn

import click

from oominfer.base.errors import EXIT_CODES, ExitStatus, OominferError
from oominfer.base.version import __version__
from oominfer.report.shapes import error_json, error_json_of


def colour() -> bool | None:
    """False when the NO_COLOR convention (https://no-color.org) asks for no colour; None
    leaves it to click, which colours only a terminal."""
    return False if os.environ.get("NO_COLOR") else None


class OominferGroup(click.Group):
    """Shows expected failures as one or two lines (or one JSON object under ``--json``)
    and exits with the documented code."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> NoReturn:
        """Run the command line; a bad flag is one ``Error:`` line and a ``Hint:``, exit 2."""
        argv = list(sys.argv[1:] if args is None else args)
        as_json = self._json_requested(argv)
        if colour() is False:
            extra.setdefault("color", False)
        try:
            code = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except BrokenPipeError:
            _quiet_stdout()
            sys.exit(0)
        except SystemExit as err:
            # click answers a closed stdout (`oominfer fit ... | head -3`) with exit 1 after
            # pacifying the streams; the reader having had enough is no failure.
            if err.code == 1 and type(sys.stdout).__name__.endswith("PacifyFlushWrapper"):
                _quiet_stdout()
                sys.exit(0)
            raise
        except click.UsageError as err:
            command = err.ctx.command_path if err.ctx else "oominfer"
            _fail(as_json, "usage", err.exit_code, err.format_message(),
                  f"see `{command} --help`.")  # fmt: skip
        except click.ClickException as err:
            if as_json:
                _fail(as_json, "usage", err.exit_code, err.format_message())
            err.show()
            sys.exit(err.exit_code)
        except click.Abort:
            if as_json:
                _fail(as_json, "interrupted", int(ExitStatus.INTERRUPTED), "Interrupted.")
            click.echo("Interrupted.", err=True)
            sys.exit(int(ExitStatus.INTERRUPTED))
        except OominferError as err:
            if os.environ.get("OOMINFER_DEBUG"):
                raise
            if err.reported:  # the command has shown it already; only the code is left
                sys.exit(int(err.exit_status))
            if as_json:
                _print_json(error_json_of(err))
                sys.exit(int(err.exit_status))
            _fail(False, err.kind, int(err.exit_status), f"{err}", err.hint)
        except Exception as err:
            if not as_json or os.environ.get("OOMINFER_DEBUG"):
                raise  # an unexpected error keeps its traceback
            traceback.print_exc()
            _fail(True, "unexpected", int(ExitStatus.ERROR), f"{type(err).__name__}: {err}",
                  "This is a bug in oominfer; OOMINFER_DEBUG=1 shows the traceback.")  # fmt: skip
        sys.exit(code if isinstance(code, int) else 0)

    def _json_requested(self, argv: Sequence[str]) -> bool:
        """True when the command line gives ``--json`` to a command that has it."""
        tokens = list(argv[: argv.index("--")] if "--" in argv else argv)
        if "--json" not in tokens:
            return False
        name = next((t for t in tokens if not t.startswith("-")), None)
        command = self.commands.get(name or "")
        return command is not None and any(p.name == "as_json" for p in command.params)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush to a closed pipe
    raises nothing either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ else 1)
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


def _print_json(data: dict[str, Any]) -> None:
    click.echo(json.dumps(data, indent=2))


def _fail(as_json: bool, kind: str, code: int, message: str, hint: str | None = None) -> NoReturn:
    """Show one failure (``Error:`` and ``Hint:`` on stderr, or the JSON shape on stdout)
    and exit with ``code``."""
    if as_json:
        _print_json(error_json(kind, code, message, hint))
    else:
        click.secho(f"Error: {message}", err=True, fg="red", color=colour())
        if hint:
            click.echo(f"Hint: {hint}", err=True)
    sys.exit(code)


HELP: Final = """Make a large language model fit the GPU you have, prove it, serve it.

oominfer reads the model's config.json and weight sizes (a local folder, the Hugging Face
cache, its built-in catalog or the Hub), predicts the memory vLLM will use, and turns the
levers (context length, FP8 KV cache, quantization, more GPUs, ...) until the model fits,
saying why for each. It then proves the plan by launching the real engine, serves it behind
the OpenAI API, and writes the Kubernetes manifests that run it.

\b
Examples:
  oominfer estimate Qwen/Qwen3-8B --gpu L4          # will it fit? (offline)
  oominfer fit Qwen/Qwen3-8B --gpu L4 -o plan.json  # plan, verify, write
  oominfer serve plan.json --port 8000              # OpenAI API on :8000
  oominfer k8s plan.json -o deploy/qwen3-8b         # Kubernetes manifests
  oominfer gpus                                     # the GPUs --gpu takes
  oominfer models                                   # models known offline

`oominfer COMMAND --help` shows a command's flags.
"""


def exit_codes_help() -> str:
    """``EXIT_CODES`` as a --help epilog: a paragraph click keeps as written, wrapped here."""
    lines = ["\b", "Exit codes:"]
    for code, meaning in EXIT_CODES.items():
        lines += textwrap.wrap(
            meaning, width=79, initial_indent=f"  {int(code):<4} ", subsequent_indent=" " * 7
        )
    return "\n".join(lines)


EPILOG: Final = (
    exit_codes_help()
    + """

A failure is one `Error:` line and at most one `Hint:` line on stderr; with --json, one JSON
object on stdout: {"error": KIND, "exit_code": N, "message": ..., "hint": ...}, plus
"shortfall_bytes" and "ways_out" when it does not fit. OOMINFER_DEBUG=1 shows the traceback of
an expected error; NO_COLOR=1 turns colour off.
"""
)


@click.group(
    cls=OominferGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    help=HELP,
    epilog=EPILOG,
)
@click.version_option(__version__, prog_name="oominfer", help="Show the version and exit.")
def main() -> None:
    """The group itself does nothing: each command is added by oominfer/cli/app.py."""
