"""A DDP-style job in real processes (torch.distributed, gloo on the CPU) reading ``StreamingShards``:
2 ranks over 4 shards of 5, 5, 5 and 3 samples (two shards a rank: 10 samples against 8, 5
batches against 4), batches of 2, two epochs. Every step all-reduces, as DDP's gradient sync does,
so a rank with a batch fewer would hang the job (the gloo timeout fails it). The padding and
``drop_last`` over DataLoader workers are checked in process: tests/test_webdataset_stream_equal.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

from loopback import LOOPBACK, free_port
from packer import ImageOptions, StorageOptions, convert
from readers import ShardDataset

ROOT = Path(__file__).resolve().parents[1]

RANK = r"""
import datetime, json, sys, zlib
import torch, torch.distributed as dist
from torch.utils.data import DataLoader
from readers import StreamingShards

data, out, rank, world, port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=30))
stream = StreamingShards(data, shuffle=True, buffer=4, seed=3, batch_size=2)  # rank, world size: torch.distributed's
log = open(f"{out}/rank{rank}.jsonl", "w")
for epoch in (0, 1):
    stream.set_epoch(epoch)
    loader = DataLoader(stream, batch_size=2)
    steps = []
    for images, _labels in loader:
        steps.append([zlib.crc32(x.numpy().tobytes()) for x in images])
        dist.all_reduce(torch.ones(1))  # DDP's gradient sync: every rank must reach it
    log.write(json.dumps({"epoch": epoch, "len": len(loader), "steps": steps}) + "\n"); log.flush()
dist.barrier()
dist.destroy_process_group()
"""


def test_two_ranks_stream_uneven_shards_in_equal_steps(image_folder, tmp_path):
    data = tmp_path / "shards"
    convert(image_folder, data, format="webdataset", image=ImageOptions(size=16), storage=StorageOptions(shard_size=5), workers=1)
    ds = ShardDataset(data)
    ids = {zlib.crc32(ds[i][0].numpy().tobytes()): i for i in range(len(ds))}
    assert len(ids) == len(ds) == 18
    out = tmp_path / "logs"
    out.mkdir()
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MASTER_ADDR": LOOPBACK}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(data), str(out), str(r), "2", port], env=env,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in ranks:
        assert p.wait(timeout=120) == 0, p.stderr.read()[-3000:]
    logs = [[json.loads(line) for line in (out / f"rank{r}.jsonl").read_text().splitlines()] for r in range(2)]
    for epoch in (0, 1):
        parts = [log[epoch] for log in logs]
        assert [len(part["steps"]) for part in parts] == [5, 5] and all(part["len"] == len(part["steps"]) for part in parts)
        seen = [{ids[c] for batch in part["steps"] for c in batch} for part in parts]
        assert set().union(*seen) == set(range(18)) and sum(map(len, seen)) == 18  # every sample; repeats only a rank's own
