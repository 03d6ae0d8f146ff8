"""Torch references of ar.bookkeeping: the definition of what each kernel must compute.

A decode step's per-row bookkeeping: the engine's state lives on the device, one row a sequence."""
from __future__ import annotations

import torch

FINISH_NONE, FINISH_STOP, FINISH_LENGTH = 0, 1, 2


def decode_inputs(rows: torch.Tensor, position: torch.Tensor, last_token: torch.Tensor,
                  block_tables: torch.Tensor, scratch: int, block_size: int):
    """Gather a decode step's inputs from the per-row state. rows [B] int64 (`scratch`: padding) ->
    positions [B] int64, cache slots [B] int64 (-1 for padding), context lengths [B] int32 (0 for
    padding), block tables [B, max_blocks] int32, the tokens to feed [B] int64."""
    pos = position[rows]
    valid = rows != scratch
    block = block_tables[rows, pos // block_size].long()
    slots = torch.where(valid, block * block_size + pos % block_size, -1)
    return pos, slots, torch.where(valid, pos + 1, 0).int(), block_tables[rows], last_token[rows]


def decode_finish(tokens: torch.Tensor, rows: torch.Tensor, out_count: torch.Tensor, min_tokens: torch.Tensor,
                  max_tokens: torch.Tensor, stop_ids: torch.Tensor, last_token: torch.Tensor, position: torch.Tensor,
                  scratch: int, out: torch.Tensor, advance: bool, write_token: bool) -> None:
    """After sampling tokens [B] for rows [B]: each row's finish code into out[-1] (FINISH_STOP: a stop
    id [rows, S] (-1: none) after min_tokens outputs; FINISH_LENGTH: max_tokens reached), its token
    into out[0] (`write_token`), and its state advanced: last token, output count and, with `advance`
    (a decode step), its position, except for the padding row."""
    count = out_count[rows] + 1
    stop = (tokens[:, None] == stop_ids[rows]).any(-1) & (count > min_tokens[rows])
    code = torch.where(stop, FINISH_STOP, torch.where(count >= max_tokens[rows], FINISH_LENGTH, FINISH_NONE))
    last_token[rows] = tokens
    out_count[rows] = count
    if advance:
        pos = position[rows]
        position[rows] = torch.where(rows != scratch, pos + 1, pos)
    if write_token:
        out[0] = tokens
    out[-1] = code


def argmax(x: torch.Tensor) -> torch.Tensor:
    """The first index of each row's maximum: x [B, V] -> int64 [B]."""
    return x.argmax(-1)
