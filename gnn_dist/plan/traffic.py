"""Predicted halo traffic: the width each layer puts on the wire and the bytes a schedule sends per epoch."""
from __future__ import annotations

from gnn_dist.comm.codec import make_codec
from gnn_dist.config import ModelConfig
from gnn_dist.models import model_class
from gnn_dist.schedules import parse_schedule


def exchanged_widths(config: ModelConfig, in_dim: int, out_dim: int) -> list[int]:
    """Width of the rows each layer puts on the wire per direction (0 for the first: cached inputs)."""
    conv_type = model_class(config.model)
    return [0 if k == 0 else conv_type.exchanged_width(i, o, **options)
            for k, (i, o, options) in enumerate(config.layers(in_dim, out_dim))]


def predicted_halo_bytes_per_epoch(total_halo_rows: int, config: ModelConfig, in_dim: int, out_dim: int,
                                   halo_dtype: str = "fp32", schedule: str = "exact",
                                   num_parts: int = 1, halo_memory: str = "resident") -> float:
    """Training halo bytes per epoch (forward rows out, gradients back), summed over ranks.

    Exact for exact, stale:R (averaged over R epochs), pipeline and the wire
    format of every halo dtype; the expectation for bns:P; an upper bound for
    adaptive schedules. Each schedule owns its figure (Schedule.predicted_bytes).
    Attention layers with sequential halos send their forward rows again in the
    backward (gnn_dist.halo.blocks.attend_blocks): three transfers per row, not two.
    """
    codec = make_codec(halo_dtype)
    widths = [w for w in exchanged_widths(config, in_dim, out_dim) if w]
    transfers = 3 if halo_memory == "sequential" and model_class(config.model).attention else 2
    schedules = parse_schedule(schedule).per_layer(len(widths))
    return sum(layer_schedule.predicted_bytes(transfers * total_halo_rows * codec.row_bytes(w), 1, num_parts)
               for layer_schedule, w in zip(schedules, widths))
