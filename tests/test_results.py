"""course.results: the stamp every published number carries, the device slug, and the files written."""

from __future__ import annotations

import json

import pytest
import torch

from course.results import name_slug, slug, stamp, write_results


@pytest.mark.parametrize("name, want", [
    # strings torch.cuda.get_device_name returns on real machines
    ("NVIDIA H200", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie"),
    ("Tesla T4", "t4"),
    ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
    ("NVIDIA A10G", "a10g"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("NVIDIA RTX A6000", "rtx-a6000"),
    ("NVIDIA GH200 480GB", "gh200"),
])
def test_gpu_names_become_short_slugs(name, want):
    assert name_slug(name) == want


def test_slug_errors_and_this_machine():
    with pytest.raises(ValueError, match="device name"):
        name_slug("  ")
    assert slug("cpu") == "cpu" and slug(torch.device("cpu")) == "cpu"
    if torch.cuda.is_available():
        assert slug("cuda") == name_slug(torch.cuda.get_device_name())


def test_stamp_names_the_machine_and_versions():
    from helpers.core.device import device_report

    s = stamp("cpu")
    assert s["device"] == device_report().cpu.model  # the one CPU name, as lesson 00 prints it
    assert s["device_type"] == "cpu" and s["slug"] == "cpu" and s["driver"] is None
    assert s["torch"] == torch.__version__ and s["threads"] == torch.get_num_threads()
    assert s["date"].endswith("+00:00") and s["cuda"] == torch.version.cuda
    import transformers

    assert s["transformers"] == transformers.__version__
    json.dumps(s)  # plain values only


def test_write_results_names_files_after_the_device(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    payload = {"stamp": stamp("cpu"), "rows": [{"x": 1.5, "dtype": torch.bfloat16}]}
    paths = write_results("bench", payload, "# a table\n", fig=fig, out_dir=tmp_path, variant="causal")
    plt.close(fig)
    names = {k: p.name for k, p in paths.items()}
    assert names == {k: f"bench-cpu-causal.{k}" for k in ("json", "md", "png")}
    data = json.loads(paths["json"].read_text())
    assert data["stamp"]["slug"] == "cpu" and data["rows"][0]["dtype"] == "torch.bfloat16"
    assert paths["md"].read_text() == "# a table\n" and paths["png"].stat().st_size > 0
    no_fig = write_results("bench", payload, "x", out_dir=tmp_path)
    assert set(no_fig) == {"json", "md"} and no_fig["md"].name == "bench-cpu.md"


def test_write_results_refuses_unstamped_or_odd_input(tmp_path):
    with pytest.raises(ValueError, match="stamp"):
        write_results("bench", {"rows": []}, "x", out_dir=tmp_path)
    with pytest.raises(ValueError, match="stem"):
        write_results("../bench", {"stamp": stamp("cpu")}, "x", out_dir=tmp_path)
    with pytest.raises(ValueError, match="markdown"):
        write_results("bench", {"stamp": stamp("cpu")}, "", out_dir=tmp_path)
    with pytest.raises(TypeError, match="JSON"):
        write_results("bench", {"stamp": stamp("cpu"), "x": object()}, "x", out_dir=tmp_path)
