"""Backend choice shared by every op: which implementation runs, and whether Pallas interprets."""

import jax

IMPLEMENTATIONS: tuple[str, ...] = ("auto", "pallas_triton", "mosaic_gpu", "xla")


def interpret_mode() -> bool:
    """Pallas kernels run in interpret mode unless they are compiled for a GPU: on a GPU backend,
    or when lowered ahead of time for an abstract GPU device (`jax.sharding.use_abstract_mesh` with
    an `AbstractDevice` of platform "gpu": how tests lower the Triton kernels on a CPU machine)."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    if device is not None:
        return device.platform != "gpu"
    return jax.default_backend() != "gpu"


def is_hopper() -> bool:
    """Whether jax's default device is an sm90 GPU (H100/H200), where Mosaic GPU kernels run."""
    device = jax.devices()[0]
    return device.platform == "gpu" and getattr(device, "compute_capability", "") == "9.0"


def resolve(implementation: str) -> str:
    """Map `implementation` to what runs: "pallas_triton", "mosaic_gpu", "xla", or "auto".

    "auto" off GPU is xla. On a GPU it stays "auto" on Hopper (sm90): each grouped matmul then runs
    on Triton unless `kernels.gmm_mgpu.AUTO_TABLE` names its shape, where Mosaic GPU measured
    faster on the H200; on other GPUs it is pallas_triton. An explicit Pallas backend off GPU runs
    the kernels in interpret mode (slow, for tests).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation={implementation!r} is not one of {IMPLEMENTATIONS}; "
            'use "auto" to let the platform decide.'
        )
    if implementation == "auto":
        if jax.default_backend() != "gpu":
            return "xla"
        return "auto" if is_hopper() else "pallas_triton"
    return implementation
