"""Wire formats for halo payloads (`--halo-dtype`): what a row of floats becomes on the wire.

    fp32  the rows as they are (4 bytes per value)
    fp16  per row a float32 scale (max |x|) and the row divided by it in half precision
          (2F + 4 bytes per row): half precision's narrow exponent would flush the small
          halo gradients of a mean loss to zero, so rows travel normalised
    bf16  cast to bfloat16 (2 bytes per value; float32's exponent range)
    int8  AdaQP-style: per row a float32 scale (max |x| / 127) and int8 values
          rounded stochastically, so the decoded value is unbiased (F + 4 bytes per row)

Encoded rows are 2-D tensors whose rows travel as raw bytes, so the bytes
counted by the communicator are exactly the bytes on the wire, scales included.
"""
from __future__ import annotations

import torch

HALO_DTYPES = ("fp32", "fp16", "bf16", "int8")


class Codec:
    name = "fp32"
    identity = True  # the wire rows are the float rows: receive straight into the destination

    def row_bytes(self, width: int) -> int:
        return 4 * width

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        return rows.contiguous()

    def decode(self, wire: torch.Tensor, out: torch.Tensor) -> None:
        if wire.data_ptr() != out.data_ptr():
            out.copy_(wire)

    def empty_wire(self, rows: int, width: int, device: torch.device) -> torch.Tensor:
        return torch.empty(rows, width, dtype=torch.float32, device=device)

    def state_dict(self) -> dict:
        """What a checkpoint keeps to resume this codec exactly (its random state, if it draws)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class CastCodec(Codec):
    identity = False

    def __init__(self, name: str, dtype: torch.dtype):
        self.name = name
        self.dtype = dtype

    def row_bytes(self, width: int) -> int:
        return 2 * width

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        return rows.to(self.dtype).contiguous()

    def decode(self, wire: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(wire)

    def empty_wire(self, rows: int, width: int, device: torch.device) -> torch.Tensor:
        return torch.empty(rows, width, dtype=self.dtype, device=device)


class ScaledHalfCodec(Codec):
    name = "fp16"
    identity = False

    def row_bytes(self, width: int) -> int:
        return 2 * width + 4

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        if rows.shape[0] == 0:  # a peer this epoch sends nothing to (adaptive, bns): byte views need a row
            return self.empty_wire(0, rows.shape[1], rows.device)
        rows = rows.float()
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
        wire = self.empty_wire(rows.shape[0], rows.shape[1], rows.device)
        wire[:, :4] = scale.view(torch.uint8).reshape(rows.shape[0], 4)
        wire[:, 4:] = (rows / scale).to(torch.float16).view(torch.uint8)
        return wire

    def decode(self, wire: torch.Tensor, out: torch.Tensor) -> None:
        if wire.shape[0] == 0:
            return
        scale = wire[:, :4].contiguous().view(torch.float32)
        out.copy_(wire[:, 4:].contiguous().view(torch.float16).float() * scale)

    def empty_wire(self, rows: int, width: int, device: torch.device) -> torch.Tensor:
        return torch.empty(rows, 2 * width + 4, dtype=torch.uint8, device=device)


class Int8Codec(Codec):
    name = "int8"
    identity = False

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def state_dict(self) -> dict:
        return {"rng": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("rng") is not None:
            self.generator.set_state(state["rng"])

    def row_bytes(self, width: int) -> int:
        return width + 4

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        if rows.shape[0] == 0:  # a peer this epoch sends nothing to (adaptive, bns): byte views need a row
            return self.empty_wire(0, rows.shape[1], rows.device)
        rows = rows.float()
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / 127.0
        scaled = rows / scale
        # Drawn on the host from the codec's own generator, then moved: the same rounding on every device.
        noise = torch.rand(scaled.shape, generator=self.generator).to(scaled.device)  # host: the CPU generator
        quantised = torch.floor(scaled + noise).clamp_(-127, 127).to(torch.int8)
        wire = self.empty_wire(rows.shape[0], rows.shape[1], rows.device)
        wire[:, :4] = scale.view(torch.uint8).reshape(rows.shape[0], 4)
        wire[:, 4:] = quantised.view(torch.uint8)
        return wire

    def decode(self, wire: torch.Tensor, out: torch.Tensor) -> None:
        if wire.shape[0] == 0:
            return
        scale = wire[:, :4].contiguous().view(torch.float32)
        out.copy_(wire[:, 4:].view(torch.int8).float() * scale)

    def empty_wire(self, rows: int, width: int, device: torch.device) -> torch.Tensor:
        return torch.empty(rows, width + 4, dtype=torch.uint8, device=device)


def make_codec(name: str, seed: int = 0, rank: int = 0) -> Codec:
    if name == "fp32":
        return Codec()
    if name == "fp16":
        return ScaledHalfCodec()
    if name == "bf16":
        return CastCodec("bf16", torch.bfloat16)
    if name == "int8":
        generator = torch.Generator().manual_seed(seed * 1_000_003 + rank)
        return Int8Codec(generator)
    raise ValueError(f"unknown --halo-dtype {name!r}: valid: {', '.join(HALO_DTYPES)}")
