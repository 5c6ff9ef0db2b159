"""Peak figures of the GPUs the benchmarks divide by, with where each comes from.

HBM bandwidth in GB/s (1e9 bytes/s) and dense (no sparsity) bf16 tensor-core TFLOP/s, from the
vendors' data sheets:
  H200 SXM: 4.8 TB/s HBM3e; 1,979 TFLOPS bf16 "with sparsity", so 989 dense
            (NVIDIA H200 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/h200).
  H100 SXM: 3.35 TB/s; 989 dense. H100 PCIe: 2.0 TB/s; 756 dense (NVIDIA H100 datasheet).
  A100 SXM4 80GB: 2,039 GB/s; A100 80GB PCIe 1,935; A100 40GB 1,555; 312 dense bf16 (A100 datasheet).
  L40S: 864 GB/s, 362 dense bf16; A10: 600 GB/s, 125 dense bf16.
Names are matched as fragments of torch.cuda.get_device_name(), most specific first.
"""

from __future__ import annotations

PEAK_GBS = {"H200": 4800.0, "H100 PCIe": 2000.0, "H100": 3350.0, "A100-SXM4-80GB": 2039.0,
            "A100 80GB PCIe": 1935.0, "A100": 1555.0, "L40S": 864.0, "A10": 600.0}
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0,
                    "A10": 125.0}
SOURCE = "vendor data sheets, dense bf16 (bench/device_peaks.py)"


def _lookup(table: dict[str, float], device_name: str) -> float | None:
    for fragment, value in table.items():
        if fragment in device_name:
            return value
    return None


def peak_gbs(device_name: str) -> float | None:
    return _lookup(PEAK_GBS, device_name)


def peak_bf16_tflops(device_name: str) -> float | None:
    return _lookup(PEAK_BF16_TFLOPS, device_name)
