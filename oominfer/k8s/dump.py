"""Manifests to YAML, once, at the end: no string templates anywhere."""

from __future__ import annotations

from typing import Any

import yaml

from oominfer.k8s.options import Manifest


class _ManifestDumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings as ``|`` blocks and never uses aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_ManifestDumper.add_representer(str, _str_representer)


def dump_yaml(docs: list[Manifest]) -> str:
    """Objects as one multi-document YAML stream, keys in the order they were built.

    A ``yaml.SafeDumper`` (what ``yaml.safe_dump_all`` uses) that writes plan.json and the
    scripts as readable ``|`` blocks and repeats shared dicts instead of anchoring them.
    """
    return yaml.dump_all(
        docs, Dumper=_ManifestDumper, sort_keys=False, explicit_start=True, width=100
    )
