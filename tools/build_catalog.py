#!/usr/bin/env python3
"""Build oominfer's offline model catalog, oominfer/data/models.json.

Inputs (standard library only, deterministic output):

* the calibration folder (default: ../shared/calibration relative to the repo
  root): every ``configs/<org>__<name>.json`` listed in ``configs/INDEX.json``.
  Entries whose id is not an HF repo id (``github:...``) are skipped. Side files
  listed under ``extra_files`` (``hf_quant_config.json``) are merged into the
  model's entry under their file stem (``"hf_quant_config"``), never into config.
* ``tools/catalog_extra/``: one ``<org>__<name>.json`` per extra model plus
  ``INDEX.json`` giving source / total_size_bytes / parameters / aliases.

Configs are copied as parsed JSON, unchanged (same keys and values as the
published config.json).  Output format::

    {"schema": 1, "models": {"<org>/<name>": {"config": {...}, "parameters": {"BF16": n},
     "total_size_bytes": n | null, "source": "...", "aliases": [...], ...}}}

Usage: python tools/build_catalog.py [--calibration DIR] [--extra DIR] [--out FILE]
"""

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCHEMA = 1

# bytes per element of unquantized checkpoints, keyed by config torch_dtype
DTYPE_BYTES = {"bfloat16": ("BF16", 2), "float16": ("F16", 2), "float32": ("F32", 4)}

# extra short names for calibration models (model id -> aliases); every model
# also gets its lowercase repo name as an alias when that is unambiguous
EXTRA_ALIASES = {
    "meta-llama/Llama-3.1-8B-Instruct": [
        "meta-llama-3.1-8b-instruct",
        "meta-llama/meta-llama-3.1-8b-instruct",
    ],
    "meta-llama/Llama-3.1-8B": ["meta-llama-3.1-8b", "meta-llama/meta-llama-3.1-8b"],
    "meta-llama/Llama-3.1-70B-Instruct": [
        "meta-llama-3.1-70b-instruct",
        "meta-llama/meta-llama-3.1-70b-instruct",
    ],
    "meta-llama/Llama-3.1-70B": ["meta-llama-3.1-70b", "meta-llama/meta-llama-3.1-70b"],
    "meta-llama/Llama-3.1-405B": ["meta-llama-3.1-405b", "meta-llama/meta-llama-3.1-405b"],
    "mistralai/Mixtral-8x7B-Instruct-v0.1": ["mixtral-8x7b-instruct"],
    "mistralai/Mixtral-8x22B-Instruct-v0.1": ["mixtral-8x22b-instruct"],
    "mistralai/Mistral-7B-Instruct-v0.3": ["mistral-7b-instruct"],
}


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)  # Python's json accepts the Infinity token some configs use


def derive_parameters(config, total_size):
    """dtype -> parameter count from the total_size of an unquantized single-dtype checkpoint."""
    if total_size is None or "quantization_config" in config:
        return None
    dtype = config.get("torch_dtype") or config.get("dtype")
    if dtype not in DTYPE_BYTES:
        return None
    key, nbytes = DTYPE_BYTES[dtype]
    if total_size % nbytes:
        return None
    return {key: total_size // nbytes}


def from_calibration(calib_dir):
    cfg_dir = Path(calib_dir) / "configs"
    index = load_json(cfg_dir / "INDEX.json")
    models = {}
    for model_id, meta in sorted(index.items()):
        if model_id.startswith("_") or "/" not in model_id or ":" in model_id:
            continue  # "_about" and non-HF ids such as github:owner/repo
        config = load_json(cfg_dir / meta["config"])
        source = meta["source"]
        if meta.get("total_size_source"):
            source += "; total_size_bytes: " + meta["total_size_source"]
        entry = {
            "config": config,
            "total_size_bytes": meta.get("total_size_bytes"),
            "source": source,
            "verbatim": bool(meta.get("verbatim", True)),
        }
        params = meta.get("params") or derive_parameters(config, entry["total_size_bytes"])
        if params:
            entry["parameters"] = params
            if not meta.get("params"):
                entry["source"] += (
                    "; parameters derived from total_size / bytes per element of torch_dtype"
                )
        if meta.get("shard_file_bytes_sum") is not None:
            entry["shard_file_bytes_sum"] = meta["shard_file_bytes_sum"]
        for fname, side in sorted((meta.get("extra_files") or {}).items()):
            entry[Path(fname).stem] = load_json(cfg_dir / side["file"])  # e.g. "hf_quant_config"
            entry["source"] += f"; {fname}: {side['source']}"
        if meta.get("note") and not entry["verbatim"]:
            entry["source"] += "; NOTE: " + meta["note"]
        models[model_id] = entry
    return models


def from_extra(extra_dir):
    extra_dir = Path(extra_dir)
    index = load_json(extra_dir / "INDEX.json")["models"]
    models = {}
    for model_id, meta in sorted(index.items()):
        config = load_json(extra_dir / meta["config"])
        entry = {
            "config": config,
            "total_size_bytes": meta.get("total_size_bytes"),
            "source": meta["source"],
            "verbatim": bool(meta["verbatim"]),
        }
        if meta.get("note"):
            entry["source"] += "; NOTE: " + meta["note"]
        if meta.get("parameters"):
            entry["parameters"] = meta["parameters"]
        if meta.get("aliases"):
            entry["aliases"] = list(meta["aliases"])
        models[model_id] = entry
    return models


def add_aliases(models):
    """Lowercase short names; drop an alias two models claim or that is another model's id."""
    wanted = {}
    for model_id, entry in models.items():
        names = set(entry.get("aliases", [])) | set(EXTRA_ALIASES.get(model_id, []))
        names.add(model_id.split("/", 1)[1].lower())
        wanted[model_id] = {n.lower() for n in names if n.lower() != model_id.lower()}
    owners = {}
    for model_id, names in wanted.items():
        for n in names:
            owners.setdefault(n, set()).add(model_id)
    ids_lower = {m.lower() for m in models}
    for model_id, names in wanted.items():
        keep = sorted(n for n in names if len(owners[n]) == 1 and n not in ids_lower)
        if keep:
            models[model_id]["aliases"] = keep
        else:
            models[model_id].pop("aliases", None)


# older remote-code configs name the layer count differently (falcon RefinedWeb: n_layer)
LAYER_KEY_FALLBACKS = ("n_layer", "num_layers", "n_layers")


def config_layers(config, strict=True):
    for c in (config, config.get("text_config") or {}):
        if "num_hidden_layers" in c:
            return c["num_hidden_layers"]
    if not strict:
        for key in LAYER_KEY_FALLBACKS:
            if key in config:
                return config[key]
    return None


def validate(models):
    problems = []
    for model_id, entry in models.items():
        cfg = entry["config"]
        if not config_layers(cfg):
            if config_layers(cfg, strict=False):
                print(
                    f"warning: {model_id}: layer count only under a legacy key "
                    f"({', '.join(k for k in LAYER_KEY_FALLBACKS if k in cfg)})",
                    file=sys.stderr,
                )
            else:
                problems.append(
                    f"{model_id}: no num_hidden_layers (or text_config.num_hidden_layers)"
                )
        if not cfg.get("architectures"):
            problems.append(f"{model_id}: no architectures")
        if entry["total_size_bytes"] is not None and not isinstance(entry["total_size_bytes"], int):
            problems.append(f"{model_id}: total_size_bytes is not an integer")
        for k, v in entry.get("parameters", {}).items():
            if not (k.isupper() and isinstance(v, int) and v > 0):
                problems.append(f"{model_id}: bad parameters entry {k}={v!r}")
    return problems


def order_entry(entry):
    """Fixed key order inside an entry (config content itself is left as published)."""
    first = ["config", "parameters", "total_size_bytes", "source", "aliases", "verbatim"]
    out = {k: entry[k] for k in first if k in entry}
    out.update({k: entry[k] for k in sorted(entry) if k not in out})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--calibration",
        default=str(REPO_ROOT.parent / "shared" / "calibration"),
        help="calibration folder holding configs/INDEX.json (default: ../shared/calibration)",
    )
    ap.add_argument("--extra", default=str(REPO_ROOT / "tools" / "catalog_extra"))
    ap.add_argument("--out", default=str(REPO_ROOT / "oominfer" / "data" / "models.json"))
    args = ap.parse_args(argv)

    models = from_calibration(args.calibration)
    for model_id, entry in from_extra(args.extra).items():
        if model_id in models:
            sys.exit(f"{model_id} is both in the calibration configs and in {args.extra}")
        models[model_id] = entry
    add_aliases(models)

    problems = validate(models)
    if problems:
        sys.exit("catalog validation failed:\n  " + "\n  ".join(problems))

    catalog = {"schema": SCHEMA, "models": {m: order_entry(models[m]) for m in sorted(models)}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(catalog, f, indent=1, ensure_ascii=False)
        f.write("\n")
    n_size = sum(1 for e in models.values() if e["total_size_bytes"] is not None)
    n_verb = sum(1 for e in models.values() if e["verbatim"])
    print(
        f"wrote {out}: {len(models)} models ({n_verb} verbatim configs, "
        f"{n_size} with total_size_bytes)"
    )


if __name__ == "__main__":
    main()
