"""Writing rendered manifests into a folder."""

from __future__ import annotations

from pathlib import Path

from oominfer.base.errors import OutputError


def write_manifests(files: dict[str, str], out_dir: Path) -> list[Path]:
    """Write ``files`` (name -> text) into ``out_dir``, creating it.

    Raises:
        OutputError: the folder or a file cannot be written.
    """
    written: list[Path] = []
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            path = out_dir / name
            path.write_text(text, encoding="utf-8")
            written.append(path)
    except OSError as err:
        raise OutputError(f"cannot write the manifests to {out_dir}: {err.strerror}.") from None
    return written
