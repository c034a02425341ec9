"""The hardware table (meshplan/hardware.py): a GPU's achieved rates per stack in one place, and a
GPU or stack it lacks named in a note, never silently priced as an H200."""

from meshplan import hardware
from meshplan.costmodel.device import GEMM_EFFICIENCY, Device
from meshplan.costmodel.stacks import get_stack
from meshplan.topologies import load_cluster


def test_measured_rates_carry_no_note():
    dev = Device.of(load_cluster("h100-sxm-8"), get_stack("megatron"))
    assert dev.gemm_efficiency == hardware.H100_GEMM_EFFICIENCY and dev.rates_note == ""
    # Megatron's attention is Transformer Engine's choice on Hopper, cuDNN's, priced by key length …
    assert dev.attention_causal == hardware.H100_CUDNN_ATTENTION_CAUSAL
    assert dev.attention_prefix == hardware.H100_CUDNN_ATTENTION_PREFIX
    # … Llama 3's stack's FlashAttention-2 at its one measured rate
    llama3 = Device.of(load_cluster("h100-sxm-8"), get_stack("llama3"))
    assert llama3.attention_causal == ((1, hardware.H100_ATTENTION_EFFICIENCY),)
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


def test_cudnn_attention_is_priced_by_key_length():
    """The table's own entries at its key lengths, log-interpolated between them (hand-computed), the
    shard's prefix rate below the whole sequence's at every length (its unmasked and causal blocks run
    apart in smaller calls)."""
    import math

    from meshplan.costmodel.device import attention_efficiency

    dev = Device.of(load_cluster("h100-sxm-8"), get_stack("megatron"))
    assert attention_efficiency(8192, False, dev) == 0.516
    assert attention_efficiency(8192, True, dev) == 0.366
    between = 0.516 + (math.log(12288) - math.log(8192)) / math.log(2) * (0.541 - 0.516)
    assert math.isclose(attention_efficiency(12288, False, dev), between)
    assert attention_efficiency(1024, False, dev) == 0.344 and attention_efficiency(131072, False, dev) == 0.569
    for keys in (2048, 4096, 8192, 16384, 32768, 65536):
        assert attention_efficiency(keys, True, dev) < attention_efficiency(keys, False, dev)


def test_every_stack_names_its_version_and_attention_kernel():
    from meshplan.costmodel.stacks import STACKS

    for stack in STACKS.values():
        assert stack.version and stack.attention_kernel and stack.source, stack.name
