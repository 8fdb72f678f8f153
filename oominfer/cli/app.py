"""The ``oominfer`` command: the group and its commands."""

from __future__ import annotations

from oominfer.cli.catalog import list_gpus, list_models
from oominfer.cli.estimate import estimate
from oominfer.cli.fit import fit
from oominfer.cli.group import main
from oominfer.cli.k8s import k8s_command
from oominfer.cli.serve import serve

for command in (estimate, fit, serve, k8s_command, list_gpus, list_models):
    main.add_command(command)

__all__ = ["main"]
