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


def resolve(implementation: str) -> str:
    """Map `implementation` to the backend that runs: "pallas_triton", "xla" or "mosaic_gpu".

    "auto" picks pallas_triton on GPU and xla elsewhere (never mosaic_gpu: slower on the H200 at
    every shape measured, benchmarks/results/2026-11-30_h200_session2/); an explicit
    Pallas backend off GPU runs the kernels in interpret mode (slow, for tests).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation={implementation!r} is not one of {IMPLEMENTATIONS}; "
            'use "auto" to let the platform decide.'
        )
    if implementation == "auto":
        return "pallas_triton" if jax.default_backend() == "gpu" else "xla"
    return implementation
