"""The ``oominfer`` command group: expected failures become a message and an exit code.

\b
Exit codes: 0 success; 1 unexpected error; 2 bad flags or input files (an impossible
setting, an unknown GPU, a dtype the GPU cannot run, a plan file that cannot be read, an
output that cannot be written, an engine that is not installed); 3 does not fit; 4 the
engine failed for a reason other than memory; 5 the model cannot be read (unknown, gated,
offline, malformed, incomplete); 130 interrupted.

\b
With --json, every failure is one JSON object on stdout: {"error": KIND, "exit_code": N,
"message": ..., "hint": ...}, plus "shortfall_bytes" and "ways_out" when it does not fit.
NO_COLOR=1 turns colour off.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from oominfer.base.errors import ExitStatus, OominferError
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


@click.group(
    cls=OominferGroup, context_settings={"help_option_names": ["-h", "--help"]}, help=__doc__
)
@click.version_option(__version__, prog_name="oominfer")
def main() -> None:
    """Make a large language model fit the GPU you have."""
