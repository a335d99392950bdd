"""The weights' chunk checksums: the loader's (torch) and the build's (numpy)
agree, and the damage the loader must refuse changes them."""

from __future__ import annotations

import os

import pytest

from hatch_precompile.engine.assemble import weights_checksums
from hatch_precompile.runtime._integrity import ROW_SIZE, chunk_checksums, torch_row_sums

CHUNK = 4 * ROW_SIZE  # small chunks, so that a few KiB make several


def loaders(data: bytes) -> list[int]:
    return chunk_checksums(bytearray(data), CHUNK, torch_row_sums)  # torch.frombuffer wants a writable buffer


@pytest.mark.parametrize("size", [0, 7, ROW_SIZE - 1, ROW_SIZE, 3 * CHUNK, 3 * CHUNK + 8, 3 * CHUNK + ROW_SIZE + 5])
def test_the_loader_and_the_build_compute_the_same_checksums(size: int) -> None:
    data = os.urandom(size)  # random words overflow their 64-bit sums all the time
    assert loaders(data) == weights_checksums(data, CHUNK)
    assert len(loaders(data)) == max(1, -(-size // CHUNK))


def _flip_a_bit(data: bytearray) -> None:
    data[len(data) // 2] ^= 0x10


def _zero_a_block(data: bytearray) -> None:
    data[ROW_SIZE : 2 * ROW_SIZE] = bytes(ROW_SIZE)


def _swap_two_blocks(data: bytearray) -> None:
    first, second = data[:ROW_SIZE], data[ROW_SIZE : 2 * ROW_SIZE]
    data[: 2 * ROW_SIZE] = second + first


def _change_the_tail(data: bytearray) -> None:
    data[-1] ^= 1


@pytest.mark.parametrize("damage", [_flip_a_bit, _zero_a_block, _swap_two_blocks, _change_the_tail])
def test_damage_changes_a_checksum(damage) -> None:
    data = bytearray(os.urandom(2 * CHUNK + 100))
    before = loaders(bytes(data))
    damage(data)
    assert loaders(bytes(data)) != before
