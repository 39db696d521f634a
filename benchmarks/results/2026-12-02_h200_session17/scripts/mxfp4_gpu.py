"""load_experts on MXFP4 gpt-oss experts at the published checkpoints' layer shapes (gpt-oss-20b:
E = 32; gpt-oss-120b: E = 128; H = I = 2880) on the default device: seconds per layer (second
call, compiled), and the dequantised values of a few experts against a numpy decoder."""

import time

import jax
import numpy as np

from moe_pallas import load_experts

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def numpy_dequant(blocks, scales):  # [R, G, 16], [R, G] -> [32·G, R] float64
    codes = np.stack([blocks & 0xF, blocks >> 4], axis=-1).reshape(*scales.shape, 32)
    values = E2M1[codes] * np.exp2(scales.astype(np.float64) - 127)[..., None]
    return values.reshape(scales.shape[0], -1).T


def main():
    rng = np.random.default_rng(0)
    h = i = 2880
    for experts in (32, 128):
        tensors = {
            "gate_up_proj_blocks": rng.integers(0, 256, (experts, 2 * i, h // 32, 16), np.uint8),
            "gate_up_proj_scales": rng.integers(112, 128, (experts, 2 * i, h // 32), np.uint8),
            "gate_up_proj_bias": np.zeros((experts, 2 * i), np.float32),
            "down_proj_blocks": rng.integers(0, 256, (experts, h, i // 32, 16), np.uint8),
            "down_proj_scales": rng.integers(112, 128, (experts, h, i // 32), np.uint8),
            "down_proj_bias": np.zeros((experts, h), np.float32),
        }
        device_tensors = {k: jax.device_put(v) for k, v in tensors.items()}
        for label, source in (("host arrays", tensors), ("device arrays", device_tensors)):
            for _ in range(2):
                start = time.perf_counter()
                params = jax.block_until_ready(load_experts(source, "gpt_oss"))
                seconds = time.perf_counter() - start
            print(f"E = {experts}, {label}: {seconds:.3f} s per layer (second call)", flush=True)
        for e in (0, experts // 2, experts - 1):
            for name, key in (("w_gate_up", "gate_up_proj"), ("w_down", "down_proj")):
                want = numpy_dequant(tensors[key + "_blocks"][e], tensors[key + "_scales"][e])
                got = np.asarray(params[name][e], np.float64)
                assert np.array_equal(got, want), (experts, e, name)
        print(f"E = {experts}: experts 0, {experts // 2}, {experts - 1} equal the numpy decoder", flush=True)


if __name__ == "__main__":
    main()
