"""``oominfer gpus`` and ``oominfer models``: what the built-in catalogs hold."""

from __future__ import annotations

import json

import click

from oominfer.cli.options import JSON


@click.command("gpus")
@JSON
def list_gpus(as_json: bool) -> None:
    """List the GPUs oominfer knows (`--gpu` takes any of these names)."""
    from oominfer.base.units import GiB
    from oominfer.hardware.gpu import catalog

    rows = catalog()
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "name": g.name,
                        "memory_bytes": g.memory_bytes,
                        "cuda_total_bytes": g.cuda_total_bytes,
                        "compute_capability": list(g.compute_capability),
                        "product_label": g.product_label,
                        "memory_bandwidth_gbps": g.memory_bandwidth_gbps,
                        "memory_type": g.memory_type,
                        "tflops_16bit": g.tflops_16bit,
                        "tflops_fp8": g.tflops_fp8,
                        "tops_int8": g.tops_int8,
                        "interconnect": g.interconnect,
                        "interconnect_gbps": g.interconnect_gbps,
                    }
                    for g in rows
                ],
                indent=2,
            )
        )
        return
    for g in rows:
        cc = ".".join(map(str, g.compute_capability))
        speed = f"{g.memory_bandwidth_gbps or 0:6,.0f} GB/s {g.tflops_16bit or 0:6,.0f} TFLOPS"
        link = f"{g.interconnect} {g.interconnect_gbps or 0:,.0f} GB/s"
        click.echo(
            f"{g.name:<32} {g.cuda_total_bytes / GiB:7.2f} GiB  cc {cc:<5} {speed}  {link:<15} "
            f"{g.product_label}"
        )


@click.command("models")
@JSON
def list_models(as_json: bool) -> None:
    """List the models of the built-in catalog (planned offline, exact sizes)."""
    from oominfer.model.catalog import catalog_ids

    if as_json:
        click.echo(json.dumps([{"id": model_id} for model_id in catalog_ids()], indent=2))
        return
    for model_id in catalog_ids():
        click.echo(model_id)
