"""--schedule "S1,S2,...": one schedule per exchanged (hidden) layer, first exchanged layer first.

The first layer aggregates the cached input features and exchanges nothing,
so a model of L layers takes L - 1 entries: `--num-layers 3 --schedule
"stale:4,exact"` refreshes the second layer's halo every 4 epochs and
exchanges the third layer's every epoch. Each entry runs exactly as it does
alone, on its own layer's rows and gradients; the entries share nothing (a
stale layer's discarded halo gradients stop at that layer, the layers below
still receive the exact gradients of their own halo rows from the layers
above). Per-layer choice pays where layers differ in width or in how much
staleness they bear: the last layer's rows are class scores, narrow and
sensitive; the inner layers' are wide and smooth.
"""
from __future__ import annotations

from gnn_dist.schedules.base import Schedule, layer_slot


class LayeredSchedule(Schedule):
    kind = "layered"  # not registered: parse_schedule builds it from a SPEC with commas

    def __init__(self, layers: list[Schedule]):
        self.layers = layers
        self._by_slot = {layer_slot(k + 1): schedule for k, schedule in enumerate(layers)}

    @property
    def name(self) -> str:  # type: ignore[override]
        return ",".join(schedule.name for schedule in self.layers)

    @property
    def runs_with_sequential_halos(self) -> bool:  # type: ignore[override]
        return all(schedule.runs_with_sequential_halos for schedule in self.layers)

    def per_layer(self, exchanged_layers: int) -> list[Schedule]:
        if exchanged_layers != len(self.layers):
            entries = "1 entry" if exchanged_layers == 1 else f"{exchanged_layers} comma-separated entries"
            raise ValueError(
                f"--schedule {self.name!r} gives {len(self.layers)} per-layer entries but the model exchanges "
                f"{exchanged_layers} layer{'s' if exchanged_layers != 1 else ''} (every layer but the first): give "
                f"{entries}, or one schedule for all layers")
        return list(self.layers)

    def for_slot(self, slot: str) -> Schedule:
        return self._by_slot[slot]

    def forward(self, ex, slot, x_owned):
        return self._by_slot[slot].forward(ex, slot, x_owned)

    def backward(self, ex, slot, grad_full, info):
        return self._by_slot[slot].backward(ex, slot, grad_full, info)

    def block_pass(self, ex, slot, x_owned):
        return self._by_slot[slot].block_pass(ex, slot, x_owned)

    def drain(self, ex):
        for schedule in self.layers:
            schedule.drain(ex)

    def reset(self):
        for schedule in self.layers:
            schedule.reset()

    def state_dict(self):
        return {f"layered/{slot}/{key}": value for slot, schedule in self._by_slot.items()
                for key, value in schedule.state_dict().items()}

    def load_state_dict(self, tensors):
        for slot, schedule in self._by_slot.items():
            prefix = f"layered/{slot}/"
            schedule.load_state_dict({key[len(prefix):]: value for key, value in tensors.items()
                                      if key.startswith(prefix)})
