"""Expert parallelism: `moe_experts(..., mesh=mesh)` runs the expert block inside `jax.shard_map`.

Layout: the E experts are split into S = mesh.shape[expert_axis] contiguous slices, shard s holding
experts [s*E/S, (s+1)*E/S); tokens are split over every mesh axis (T padded to a multiple of the
mesh size with tokens that route nowhere). Per device, on its T_loc tokens and M = T_loc*k rows:

    1. sort the (token, slot) pairs by expert: rows for shard d are contiguous, `counts[d]` of them;
    2. exchange over `expert_axis`: shard d receives its rows, their local expert ids and weights;
    3. y_row = weight * expert(x_row) on the received rows (the single-device `moe_experts`);
    4. exchange back, and out[t] = sum_j y_row(t, j), summed in float32 in slot order.

Exchanges (`exchange=`):
  - "all_to_all": `jax.lax.all_to_all` of fixed [S, C] slots per device, C rows per (source,
    destination) pair. Runs on every platform. Rows past C are dropped.
  - "ragged": `jax.lax.ragged_all_to_all` (GPU only: XLA:CPU does not implement it), no padding on
    the wire; each receiver holds B rows and rows past B (in source order) are dropped.
  - "auto": "all_to_all" on every platform: in jax 0.11.2 `ragged_all_to_all` moved rows ~40x
    slower than `all_to_all` between two NVLink-connected H200s (docs/decisions.md).

`capacity_factor` f sizes the receive buffer of each device at f times the balanced load M rows:
C = ceil(f*M/S) per pair, or B = ceil(f*M); rows past it are dropped. `None` (default) never
drops: ragged sizes B for the worst case (every row to one shard, B = S*M: memory, not wire
traffic); all_to_all sends a first round of C = ceil(1.25*M/S) rows per pair and, only if some
pair on the mesh holds more, a second round with the remaining ranks [C, M) (worst-case size),
under a `lax.cond` that every device evaluates alike; the experts run once on both rounds' rows.
Dropped rows contribute zero; their count is in the stats (`return_stats=True`, with the second
round's rows as "spilled_rows"), and under `moe_pallas.debug_checks()` a drop raises.

Gradients flow through both exchanges (their transposes are the reverse exchanges); weight
gradients of data-parallel replicas are summed by shard_map.
"""

import functools
import math
from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from moe_pallas import backends, debug, dispatch, fused, quant

Exchange = Literal["auto", "all_to_all", "ragged"]
EXCHANGES: tuple[str, ...] = ("auto", "all_to_all", "ragged")


def expert_mesh(
    num_expert_shards: int | None = None,
    data: int | None = None,
    *,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """A `("data", "expert")` mesh over `devices` (default: `jax.devices()`, every process's).

    The expert axis is the inner one, so expert shards sit on neighbouring devices (one host's
    NVLink domain when num_expert_shards <= local devices) and data replicas span hosts.
    Defaults: all devices on "expert"; give one of the two sizes and the other is inferred.
    Axes are `AxisType.Auto`: pass global arrays of any sharding, they are resharded as needed.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if num_expert_shards is None:
        num_expert_shards = n // data if data else n
    if data is None:
        data = n // num_expert_shards if num_expert_shards > 0 else 0
    if num_expert_shards < 1 or data < 1 or num_expert_shards * data != n:
        raise ValueError(
            f"expert_mesh(num_expert_shards={num_expert_shards}, data={data}) does not tile "
            f"{n} devices; choose sizes whose product is {n}."
        )
    grid = np.asarray(devices, dtype=object).reshape(data, num_expert_shards)
    return Mesh(grid, ("data", "expert"), axis_types=(AxisType.Auto, AxisType.Auto))


class _Plan(NamedTuple):
    """Where each of a device's M = T_loc*k (token, slot) pairs goes, sorted by expert."""

    order: jax.Array  # [M] sorted row r holds pair order[r] = t*k + j
    row_of_pair: jax.Array  # [M] inverse of order
    sorted_expert: jax.Array  # [M] global expert of each sorted row (E for invalid ids)
    dest: jax.Array  # [M] destination shard of each pair (S for invalid ids)
    rank: jax.Array  # [M] position of each pair among the rows for its destination
    counts: jax.Array  # [S] rows for each destination shard
    start: jax.Array  # [S] first sorted row for each destination shard


def _plan(topk_idx: jax.Array, experts_per_shard: int, num_shards: int) -> _Plan:
    """The expert sort (`dispatch.dispatch`) read per destination shard: shard s's rows are the
    groups of its experts [s·E/S, (s+1)·E/S), contiguous in the sorted order."""
    d = dispatch.dispatch(topk_idx, experts_per_shard * num_shards)
    dest = d.row_expert[d.pair_row] // experts_per_shard  # S for masked ids
    shard_offsets = d.group_offsets[::experts_per_shard]  # [S + 1]
    start, counts = shard_offsets[:-1], jnp.diff(shard_offsets)
    rank = d.pair_row - start[jnp.minimum(dest, num_shards - 1)]
    return _Plan(d.row_pair, d.pair_row, d.row_expert, dest, rank, counts, start)


# apply(x_rows [R, H], local_expert [R], weight [R]) -> weight * expert(x_rows) [R, H]; rows whose
# local_expert is out of range must give zero (the padding of the receive buffers).
ApplyFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


class _RoundTrip(NamedTuple):
    y_back: jax.Array  # [R, H] weighted expert outputs, back in this device's send-slot order
    token_of_slot: jax.Array  # [R] token of each send slot, -1 for an empty slot
    slot_of_pair: jax.Array  # [M] slot of each (token, j) pair, -1 where not computed
    received: jax.Array  # [] rows this device computed
    spilled: jax.Array | int = 0  # [] of those, rows that came in a second all_to_all round


def _gather_slots(x, token_of_slot):
    return jnp.where((token_of_slot >= 0)[:, None], x[jnp.maximum(token_of_slot, 0)], 0)


def _sum_slots(rows, slot_of_pair, use_kernel):
    """out[t] = sum_j rows[slot_of_pair[t, j]] in float32, j ascending; -1 adds nothing."""
    combine = backends.get("pallas_triton" if use_kernel else "xla").combine
    return combine(rows, slot_of_pair, out_dtype=jnp.float32)


# The two linear maps between tokens and send slots, each the other's transpose. As custom VJPs
# the backward of each is the other map: a row gather and a gather-sum, where XLA's own
# transposes are scatter-adds. XLA also fused the forward's gathers, masks and k-sum into one
# slow reduction (over a quarter of the SwiGLU forward on 2 H200s, docs/decisions.md).
@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _to_slots(x, token_of_slot, slot_of_pair, use_kernel):
    """x_send[s] = x[token_of_slot[s]] (zero rows for empty slots); slot_of_pair [T, k]."""
    return _gather_slots(x, token_of_slot)


def _to_slots_fwd(x, token_of_slot, slot_of_pair, use_kernel):
    return _gather_slots(x, token_of_slot), slot_of_pair


def _to_slots_bwd(use_kernel, slot_of_pair, d_send):
    return _sum_slots(d_send, slot_of_pair, use_kernel).astype(d_send.dtype), None, None


_to_slots.defvjp(_to_slots_fwd, _to_slots_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _from_slots(y_back, token_of_slot, slot_of_pair, use_kernel, dtype):
    """out[t] = sum_j y_back[slot_of_pair[t, j]] in float32 (slot_of_pair as [T, k]); dtype is
    y_back's."""
    return _sum_slots(y_back, slot_of_pair, use_kernel)


def _from_slots_fwd(y_back, token_of_slot, slot_of_pair, use_kernel, dtype):
    return _sum_slots(y_back, slot_of_pair, use_kernel), token_of_slot


def _from_slots_bwd(use_kernel, dtype, token_of_slot, d_out):
    return _gather_slots(d_out.astype(dtype), token_of_slot), None, None


_from_slots.defvjp(_from_slots_fwd, _from_slots_bwd)


def _meta(local_expert, weight):
    """Local expert ids and routing weights as one float32 [R, 2] array: one collective, not two
    (ids < 2^24 are exact in float32)."""
    return jnp.stack([local_expert.astype(jnp.float32), weight.astype(jnp.float32)], axis=-1)


def _slot_maps(plan: _Plan, top_k, capacity, first):
    """Slots (d, c) for the ranks [first, first + C) of each destination d, slot d*C + c holding
    sorted row start[d] + first + c: (token_of_slot [S*C], slot_of_pair [M], filled [S, C],
    sorted_row [S, C])."""
    num_shards = plan.counts.shape[0]
    slot = first + jnp.arange(capacity, dtype=jnp.int32)
    filled = slot[None, :] < plan.counts[:, None]  # [S, C]
    sorted_row = jnp.where(filled, plan.start[:, None] + slot[None, :], 0)
    token_of_slot = jnp.where(filled, plan.order[sorted_row] // top_k, -1).reshape(-1)
    kept = (plan.dest < num_shards) & (plan.rank >= first) & (plan.rank < first + capacity)
    slot_of_pair = jnp.where(kept, plan.dest * capacity + plan.rank - first, -1)
    return token_of_slot, slot_of_pair, filled, sorted_row


def _slot_meta(weight, plan: _Plan, experts_per_shard, filled, sorted_row):
    """[S*C, 2] local expert id (experts_per_shard, i.e. masked, for empty slots) and weight."""
    pair = plan.order[sorted_row]
    shard = jnp.arange(plan.counts.shape[0], dtype=jnp.int32)[:, None]
    local = jnp.where(
        filled, plan.sorted_expert[sorted_row] - shard * experts_per_shard, experts_per_shard
    )
    return _meta(local, jnp.where(filled, weight.reshape(-1)[pair], 0)).reshape(-1, 2)


def _all_to_all(a, axis):
    return jax.lax.all_to_all(a, axis, 0, 0, tiled=True)


def _all_to_all_round_trip(
    x, weight, plan: _Plan, apply: ApplyFn, axis, experts_per_shard, capacity, use_kernel
):
    """Fixed slots, C rows per (source, destination) pair; ranks past C are dropped."""
    token_of_slot, slot_of_pair, filled, sorted_row = _slot_maps(plan, weight.shape[1], capacity, 0)
    x_send = _to_slots(x, token_of_slot, slot_of_pair.reshape(weight.shape), use_kernel)
    meta_send = _slot_meta(weight, plan, experts_per_shard, filled, sorted_row)
    x_recv, meta = _all_to_all(x_send, axis), _all_to_all(meta_send, axis)
    local_recv = meta[:, 0].astype(jnp.int32)
    y = apply(x_recv, local_recv, meta[:, 1].astype(weight.dtype))
    received = jnp.sum(local_recv < experts_per_shard, dtype=jnp.int32)
    return _RoundTrip(_all_to_all(y, axis), token_of_slot, slot_of_pair, received)


def _dropless_all_to_all_round_trip(
    x, weight, plan: _Plan, apply: ApplyFn, axis, experts_per_shard, capacity, use_kernel, mesh_axes
):
    """C rows per pair, then, only when some pair anywhere on the mesh holds more (a pmax over
    every axis, so all devices take the same branch and no collective waits for a peer that
    skipped it), a second all_to_all with the ranks [C, M) of every pair: dropless, with the
    wire carrying S*C rows, not the S*M of one worst-case round, when the load is balanced.

    Only the collectives sit under `lax.cond`; the experts run once on both rounds' rows (the
    second round's are masked when it is skipped, costing zero writes). With the experts inside
    the cond, fwd+bwd on 2 H200s was slower than one worst-case round (docs/decisions.md),
    presumably because the cond's gradient returns zeros for every local weight from the untaken
    branch and adds them.
    """
    spill = plan.order.shape[0] - capacity
    if spill <= 0:
        return _all_to_all_round_trip(
            x, weight, plan, apply, axis, experts_per_shard, capacity, use_kernel
        )
    num_shards, top_k = plan.counts.shape[0], weight.shape[1]
    overflow = jax.lax.pmax(jnp.max(plan.counts), mesh_axes) > capacity
    first, second = _slot_maps(plan, top_k, capacity, 0), _slot_maps(plan, top_k, spill, capacity)
    split = num_shards * capacity
    token_of_slot = jnp.concatenate([first[0], second[0]])
    slot_of_pair = jnp.where(
        first[1] >= 0, first[1], jnp.where(second[1] >= 0, split + second[1], -1)
    )
    # Without an overflow the second round's slots are all empty (zero rows, masked ids): the
    # skipped branch keeps them as they are instead of exchanging them.
    x_send = _to_slots(x, token_of_slot, slot_of_pair.reshape(weight.shape), use_kernel)
    meta_send = jnp.concatenate(
        [_slot_meta(weight, plan, experts_per_shard, *m[2:]) for m in (first, second)]
    )
    x_first, meta_first = _all_to_all(x_send[:split], axis), _all_to_all(meta_send[:split], axis)
    x_second, meta_second = jax.lax.cond(
        overflow,
        lambda: (_all_to_all(x_send[split:], axis), _all_to_all(meta_send[split:], axis)),
        lambda: (x_send[split:], meta_send[split:]),
    )
    meta = jnp.concatenate([meta_first, meta_second])
    local_recv = meta[:, 0].astype(jnp.int32)
    y = apply(jnp.concatenate([x_first, x_second]), local_recv, meta[:, 1].astype(weight.dtype))
    y_second = jax.lax.cond(overflow, lambda: _all_to_all(y[split:], axis), lambda: y[split:])
    computed = local_recv < experts_per_shard
    return _RoundTrip(
        jnp.concatenate([_all_to_all(y[:split], axis), y_second]),
        token_of_slot,
        slot_of_pair,
        jnp.sum(computed, dtype=jnp.int32),
        jnp.sum(computed[split:], dtype=jnp.int32),
    )


def _ragged_round_trip(
    x, weight, plan: _Plan, apply: ApplyFn, axis, experts_per_shard, capacity, use_kernel
):
    """Ragged slices: source s writes its rows for d at offset sum_{s'<s} counts[s'][d] of d's
    buffer of `capacity` rows; what does not fit is not sent, so rows [0, received) are filled."""
    num_shards, top_k = plan.counts.shape[0], weight.shape[1]
    me = jax.lax.axis_index(axis)
    counts = jax.lax.all_gather(plan.counts, axis)  # [source, destination]
    recv_offset = jnp.cumsum(counts, axis=0) - counts
    sent = jnp.clip(capacity - recv_offset, 0, counts)
    send_offset = jnp.cumsum(counts, axis=1) - counts
    received = jnp.sum(sent[:, me])

    def exchange(operand, rows, in_offsets, send_sizes, out_offsets, recv_sizes):
        output = jnp.zeros((rows, *operand.shape[1:]), operand.dtype)
        return jax.lax.ragged_all_to_all(
            operand, output, in_offsets, send_sizes, out_offsets, recv_sizes, axis_name=axis
        )

    forward = (send_offset[me], sent[me], recv_offset[me], sent[:, me])
    backward = (recv_offset[:, me], sent[:, me], send_offset[:, me], sent[me])
    pair = plan.order
    kept = (plan.dest < num_shards) & (plan.rank < sent[me][jnp.minimum(plan.dest, num_shards - 1)])
    # The send slots are the sorted rows; slot r holds pair order[r].
    token_of_slot = jnp.where(kept[pair], pair // top_k, -1)
    slot_of_pair = jnp.where(kept, plan.row_of_pair, -1)
    sorted_shard = jnp.minimum(plan.sorted_expert // experts_per_shard, num_shards - 1)
    x_send = _to_slots(x, token_of_slot, slot_of_pair.reshape(weight.shape), use_kernel)
    x_recv = exchange(x_send, capacity, *forward)
    local = plan.sorted_expert - sorted_shard * experts_per_shard
    meta = exchange(_meta(local, weight.reshape(-1)[pair]), capacity, *forward)
    filled = jnp.arange(capacity) < received
    local_recv = jnp.where(filled, meta[:, 0].astype(jnp.int32), experts_per_shard)
    y = apply(x_recv, local_recv, meta[:, 1].astype(weight.dtype))
    y_back = exchange(y, pair.shape[0], *backward)
    return _RoundTrip(y_back, token_of_slot, slot_of_pair, received)


def trip_output(trip: _RoundTrip, pair_shape: tuple[int, int], use_kernel: bool) -> jax.Array:
    """out [T, H] float32: each token's k computed rows of a round trip, summed in slot order."""
    slot_of_pair = trip.slot_of_pair.reshape(pair_shape)
    return _from_slots(trip.y_back, trip.token_of_slot, slot_of_pair, use_kernel, trip.y_back.dtype)


def round_trip_fn(
    exchange: str, capacity_factor: float | None, mesh_axes: tuple[str, ...], use_kernel: bool
):
    """The exchange round trip `moe_experts` runs;
    use_kernel: the token <-> slot gather-sums run the Pallas combine kernel, else XLA."""
    if exchange == "ragged":
        fn = _ragged_round_trip
    elif capacity_factor is None:
        fn = functools.partial(_dropless_all_to_all_round_trip, mesh_axes=mesh_axes)
    else:
        fn = _all_to_all_round_trip
    return functools.partial(fn, use_kernel=use_kernel)


def resolve_exchange(exchange: str) -> str:
    """Map "auto" to "all_to_all" (see the module docstring for why); reject unknown names."""
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange={exchange!r}; use one of {EXCHANGES}.")
    return "all_to_all" if exchange == "auto" else exchange


# Dropless all_to_all: the first round's slots per pair, in units of the balanced load M/S. Random
# routing rarely passes 1.25x on a pair (the second round then costs one cond); a skewed router
# pays a second, worst-case round.
FIRST_ROUND_FACTOR = 1.25


def capacity_rows(exchange: str, rows: int, num_shards: int, capacity_factor: float | None) -> int:
    """Receive-buffer rows: C per (source, destination) pair for all_to_all (with
    capacity_factor=None: its first round), B for ragged."""
    if exchange == "all_to_all":
        worst, balanced = rows, rows / num_shards
        capacity_factor = capacity_factor or FIRST_ROUND_FACTOR
    else:
        worst, balanced = rows * num_shards, rows
    if capacity_factor is None:
        return worst
    return max(1, min(worst, math.ceil(capacity_factor * balanced)))


def _auto_outside_mesh_context(mesh: Mesh, arrays) -> Mesh:
    """`mesh` with Auto axes when it has Explicit ones (`jax.make_mesh`'s default) but neither a
    mesh context (`jax.set_mesh`) nor an input's type names a mesh. Explicit axes put the mesh
    into the output's type; outside a mesh context `jax.grad` then cannot build the cotangent of
    such a loss ("Length of device assignment 1 is not equal to the size of the mesh"). With Auto
    axes the sharding lives in the values, as for `expert_mesh()`, and the math is the same."""
    if AxisType.Explicit not in mesh.axis_types or not jax.sharding.get_abstract_mesh().empty:
        return mesh
    if any(not jax.typeof(a).sharding.mesh.empty for a in arrays):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def _to_mesh(a: jax.Array, mesh: Mesh, spec: P) -> jax.Array:
    """Explicit-axis meshes need inputs laid out as in_specs says; Auto axes reshard in shard_map."""
    if all(t == AxisType.Explicit for t in mesh.axis_types):
        return jax.reshard(a, NamedSharding(mesh, spec))
    return a


def _raise_on_counts(counts, num_experts: int, capacity: int, exchange: str, _after) -> None:
    dropped, bad_ids, bad_weights, bad_x = np.asarray(counts).tolist()
    debug._raise_if(
        bad_ids > 0,
        f"topk_idx holds {bad_ids} expert ids outside [0, {num_experts}); "
        "fix the router or num_experts.",
    )
    debug._raise_if(bad_weights > 0, "topk_weight holds NaN or Inf; check the router logits.")
    debug._raise_if(bad_x > 0, "x holds NaN or Inf; check the layer input.")
    debug._raise_if(
        dropped > 0,
        f"expert parallelism dropped {dropped} (token, slot) rows: the {exchange} receive buffer "
        f"holds {capacity} rows; raise capacity_factor (None never drops).",
    )


def _debug_counts(x, topk_idx, topk_weight, dropped, num_tokens, num_experts, axes):
    """[dropped, bad ids, bad weights, bad x] of this device's real (unpadded) tokens."""
    token = jax.lax.axis_index(axes) * x.shape[0] + jnp.arange(x.shape[0])
    real = (token < num_tokens)[:, None]
    bad_ids = real & ((topk_idx < 0) | (topk_idx >= num_experts))
    bad_weights = real & ~jnp.isfinite(topk_weight)
    bad_x = real & ~jnp.isfinite(x)
    return jnp.stack(
        [dropped] + [jnp.sum(b, dtype=jnp.int32) for b in (bad_ids, bad_weights, bad_x)]
    )


def moe_experts_parallel(
    x: jax.Array,
    topk_idx: jax.Array,
    topk_weight: jax.Array,
    params: dict[str, jax.Array | quant.QuantizedWeight],
    *,
    activation: str,
    implementation: str,
    mesh: Mesh | None,
    expert_axis: str = "expert",
    exchange: Exchange = "auto",
    capacity_factor: float | None = None,
    fp8_training: bool = False,
) -> tuple[jax.Array, dict[str, jax.Array | int]]:
    """The body of `moe_experts(..., mesh=mesh, return_stats=True)`; inputs validated, params a dict.

    Returns (out [T, H], stats) with stats = {"dropped_rows": int32[] over the whole mesh,
    "rows_per_shard": int32[S] rows computed by each expert shard (summed over other axes),
    "capacity_rows": the receive-buffer size (C per pair for all_to_all, of its first round when
    dropless; B for ragged), "spilled_rows": int32[] rows the dropless all_to_all sent in its
    second round (0 when the first round held every pair)}.
    With mesh=None it is the single-device call, which drops nothing (S = 1).
    """
    policy = backends.resolve(implementation)
    if mesh is None:
        debug.check_routing(x, topk_idx, topk_weight, params["w_gate_up"].shape[0])
        out = fused.expert_block(x, topk_idx, topk_weight, params, activation, policy, fp8_training)
        num_experts = params["w_gate_up"].shape[0]
        rows = jnp.sum((topk_idx >= 0) & (topk_idx < num_experts), dtype=jnp.int32)
        return out, {
            "dropped_rows": jnp.zeros((), jnp.int32),
            "rows_per_shard": rows[None],
            "capacity_rows": topk_idx.size,
            "spilled_rows": jnp.zeros((), jnp.int32),
        }
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"mesh must be a jax.sharding.Mesh (see moe_pallas.expert_mesh), got {type(mesh)}."
        )
    if expert_axis not in mesh.axis_names:
        raise ValueError(
            f"expert_axis={expert_axis!r} is not an axis of the mesh {mesh.axis_names}."
        )
    if capacity_factor is not None and not capacity_factor > 0:
        raise ValueError(
            f"capacity_factor must be > 0 or None (never drop), got {capacity_factor}."
        )
    num_shards = mesh.shape[expert_axis]
    num_experts = params["w_gate_up"].shape[0]
    if num_experts % num_shards:
        raise ValueError(
            f"{num_experts} experts do not split over {num_shards} shards of mesh axis "
            f"{expert_axis!r}; use an expert count divisible by the axis size."
        )
    exchange = resolve_exchange(exchange)
    mesh = _auto_outside_mesh_context(mesh, (x, topk_idx, topk_weight, *jax.tree.leaves(params)))
    experts_per_shard = num_experts // num_shards
    num_tokens, top_k = topk_idx.shape
    pad = -num_tokens % mesh.size
    if pad:  # tokens with expert id -1 route nowhere and are sliced off
        x = jnp.pad(x, ((0, pad), (0, 0)))
        topk_idx = jnp.pad(topk_idx, ((0, pad), (0, 0)), constant_values=-1)
        topk_weight = jnp.pad(topk_weight, ((0, pad), (0, 0)))
    rows = (num_tokens + pad) // mesh.size * top_k
    capacity = capacity_rows(exchange, rows, num_shards, capacity_factor)
    axes = tuple(mesh.axis_names)
    use_kernel = policy != "xla"
    round_trip = round_trip_fn(exchange, capacity_factor, axes, use_kernel)
    other_axes = tuple(a for a in axes if a != expert_axis)

    def shard_body(x, topk_idx, topk_weight, params):
        def apply(x_rows, local_expert, weight):
            # Padding rows carry out-of-range ids on purpose: they give zero, unchecked.
            return fused.expert_block(
                x_rows,
                local_expert[:, None],
                weight[:, None],
                params,
                activation,
                policy,
                fp8_training,
            )

        plan = _plan(topk_idx, experts_per_shard, num_shards)
        trip = round_trip(x, topk_weight, plan, apply, expert_axis, experts_per_shard, capacity)
        out = trip_output(trip, topk_idx.shape, use_kernel)
        dropped = jnp.sum(plan.dest < num_shards, dtype=jnp.int32) - jnp.sum(
            trip.slot_of_pair >= 0, dtype=jnp.int32
        )
        received = trip.received[None]
        if other_axes:
            received = jax.lax.psum(received, other_axes)
        spilled = jax.lax.psum(jnp.asarray(trip.spilled, jnp.int32), axes)
        if not debug.enabled():
            return out.astype(x.dtype), jax.lax.psum(dropped, axes), received, spilled
        # Checked on mesh-wide counts after the last exchange, so every device raises together: a
        # lone raise would strand its peers inside a collective until XLA aborts the process.
        counts = jax.lax.psum(
            _debug_counts(x, topk_idx, topk_weight, dropped, num_tokens, num_experts, axes), axes
        )
        jax.debug.callback(_raise_on_counts, counts, num_experts, capacity, exchange, out[:1, :1])
        return out.astype(x.dtype), counts[0], received, spilled

    tokens = P(axes)
    # A quantised weight's values and scales both lead with E: one spec splits the pair alike.
    expert_slices = {name: P(expert_axis) for name in params}
    args = [_to_mesh(a, mesh, tokens) for a in (x, topk_idx, topk_weight)]
    params = jax.tree.map(lambda p: _to_mesh(p, mesh, P(expert_axis)), params)
    # One jit around the exchange: called eagerly, shard_map would dispatch its collectives and
    # the dropless second round op by op (seconds per call on CPU).
    out, dropped, received, spilled = jax.jit(
        jax.shard_map(
            shard_body,
            mesh=mesh,
            in_specs=(tokens, tokens, tokens, expert_slices),
            out_specs=(tokens, P(), P(expert_axis), P()),
            # Pallas kernels inside declare no varying-axes type for their outputs (a pallas_call
            # under check_vma=True needs one); the collectives here are written out explicitly.
            check_vma=False,
        )
    )(*args, params)
    stats = {
        "dropped_rows": dropped,
        "rows_per_shard": received,
        "capacity_rows": capacity,
        "spilled_rows": spilled,
    }
    if pad:
        out = _to_mesh(out, mesh, P())[:num_tokens]  # explicit axes cannot slice a sharded dim
    return out, stats
