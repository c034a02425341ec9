"""The hardware table (meshplan/hardware.py): a GPU's achieved rates per stack in one place, and a
GPU or stack it lacks named in a note, never silently priced as an H200."""

from meshplan import hardware
from meshplan.costmodel.device import GEMM_EFFICIENCY, Device
from meshplan.costmodel.stacks import get_stack
from meshplan.topologies import load_cluster


def test_measured_rates_carry_no_note():
    dev = Device.of(load_cluster("h100-sxm-8"), get_stack("megatron"))
    assert dev.gemm_efficiency == hardware.H100_GEMM_EFFICIENCY and dev.rates_note == ""
    assert dev.attention_causal == ((1, hardware.H100_ATTENTION_EFFICIENCY),)
    a100 = Device.of(load_cluster("a100-sxm-8"), get_stack("megatron-2021"))
    assert a100.gemm_efficiency == hardware.A100_GEMM_EFFICIENCY and a100.rates_note == ""
    assert Device.of(load_cluster("h200-8"), get_stack("meshplan")).rates_note == ""


def test_a_gpu_the_table_lacks_is_named():
    dev = Device.of(load_cluster("mi300x-8"), get_stack("megatron"))
    assert dev.gemm_efficiency == GEMM_EFFICIENCY  # the executor's H200 rate, borrowed …
    assert "MI300X" in dev.rates_note and "H200" in dev.rates_note  # … and said so
    # A stack the table has no entry for on a known GPU is named too.
    assert "deepspeed" in Device.of(load_cluster("h100-sxm-8"), get_stack("deepspeed")).rates_note


def test_device_names_find_their_preset():
    assert hardware.preset_for_device("NVIDIA H100 80GB HBM3") == ("h100-sxm-8", "")
    assert hardware.preset_for_device("NVIDIA H200")[0] == "h200-8"
    assert hardware.preset_for_device("NVIDIA B200") == ("dgx-b200-8", "")
    preset, note = hardware.preset_for_device("NVIDIA L40S")
    assert preset == "h200-8" and "L40S" in note
