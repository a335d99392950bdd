"""What the loader's check of a weights file costs, timed in one process.

    python benchmarks/weights_check.py FILE [--runs N]

FILE is a shipped weights.safetensors (`./dev.sh bench --models mlp_2gb` installs
one of 2.1 GB under .demo/venv). Each way of reading it runs on a fresh
copy-on-write mapping, as the loader makes, with the file's pages in the page
cache (the first run warms it), and the table gives the median and range over
--runs: touching one byte a page (the page faults any first call takes anyway),
the loader's check (`runtime/_integrity.py`: the CRC-32 of each 4 KiB row's sum,
torch on every core), and the CRC-32 of every byte on as many threads (the
check before it). Cold starts are too noisy on a shared machine to resolve the
difference; this is not.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hatch_precompile.runtime._integrity import CHUNK_SIZE, chunk_checksums, torch_row_sums


def touch_pages(mapping: mmap.mmap) -> None:
    torch.frombuffer(mapping, dtype=torch.uint8)[::4096].sum()


def row_sums(mapping: mmap.mmap) -> None:
    chunk_checksums(mapping, CHUNK_SIZE, torch_row_sums)


def crc32_of_bytes(mapping: mmap.mmap) -> None:
    view = memoryview(mapping)
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(lambda start: zlib.crc32(view[start : start + CHUNK_SIZE]), range(0, len(view), CHUNK_SIZE)))


WAYS: list[tuple[str, Callable[[Any], None]]] = [
    ("touch one byte a page (the page faults any first call takes)", touch_pages),
    ("the loader's check: CRC-32 of each 4 KiB row's sum (torch)", row_sums),
    ("CRC-32 of every byte, one thread per core (the check before)", crc32_of_bytes),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    size = args.file.stat().st_size
    print(f"{args.file} ({size / 1e9:.2f} GB), torch {torch.__version__} on {torch.get_num_threads()} threads, {os.cpu_count()} CPUs\n")
    print("| work | time, s (min-max) | speed |\n|---|---|---|")
    args.file.read_bytes()  # the page cache, warm for every way alike
    for title, way in WAYS:
        times = []
        for _ in range(args.runs):
            with args.file.open("rb") as stream:
                mapping = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_COPY)
            started = time.perf_counter()
            way(mapping)
            times.append(time.perf_counter() - started)
            mapping.close()
        median = statistics.median(times)
        print(f"| {title} | {median:.3f} ({min(times):.3f}-{max(times):.3f}) | {size / median / 1e9:.1f} GB/s |")


if __name__ == "__main__":
    main()
