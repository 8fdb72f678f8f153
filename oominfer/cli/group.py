"""The ``oominfer`` command group: expected failures become a message and an exit code.

\b
Exit codes: 0 success; 1 unexpected error; 2 bad flags or input files (an impossible
setting, an unknown GPU, a dtype the GPU cannot run, a plan file that cannot be read, an
output that cannot be written); 3 does not fit; 4 the engine failed for a reason other than
memory; 5 the model cannot be read (unknown, gated, offline, malformed); 130 interrupted.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from oominfer.errors import ExitStatus, OominferError
from oominfer.version import __version__


class OominferGroup(click.Group):
    """Shows expected failures as one or two lines and the documented exit code."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> NoReturn:
        """Run the command line; a bad flag is one ``Error:`` line and a ``Hint:``, exit 2."""
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as err:
            command = err.ctx.command_path if err.ctx else "oominfer"
            click.secho(f"Error: {err.format_message()}", err=True, fg="red")
            click.echo(f"Hint: see `{command} --help`.", err=True)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            err.show()
            sys.exit(err.exit_code)
        except click.Abort:
            click.echo("Interrupted.", err=True)
            sys.exit(int(ExitStatus.INTERRUPTED))
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command, translating OominferError into a message and an exit code."""
        try:
            return super().invoke(ctx)
        except OominferError as err:
            if os.environ.get("OOMINFER_DEBUG"):
                raise
            if not err.reported:
                click.secho(f"Error: {err}", err=True, fg="red")
                if err.hint:
                    click.echo(f"Hint: {err.hint}", err=True)
            ctx.exit(int(err.exit_status))
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            ctx.exit(int(ExitStatus.INTERRUPTED))


@click.group(
    cls=OominferGroup, context_settings={"help_option_names": ["-h", "--help"]}, help=__doc__
)
@click.version_option(__version__, prog_name="oominfer")
def main() -> None:
    """Make a large language model fit the GPU you have."""
