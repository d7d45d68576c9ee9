"""A DDP-style job in real processes (torch.distributed, gloo on the CPU): 2 ranks read part of an
epoch with ``Loader`` and are killed after rank 0 saved its state; 3 ranks resume it with
``ResumableSampler`` in a plain ``DataLoader`` and another batch size. Every step all-reduces,
as DDP's gradient sync does, so a rank with a batch fewer would hang the job (a timeout fails it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import zlib

from loopback import LOOPBACK, free_port
from readers import LMDBDataset
from readers.epoch import EpochPlan

ROOT = Path(__file__).resolve().parents[1]
SAMPLES, SEED, EPOCH = 18, 5, 1

RANK = r"""
import datetime, json, os, sys, time, zlib
import torch, torch.distributed as dist
from torch.utils.data import DataLoader
from readers import LMDBDataset, Loader, ResumableSampler

data, out, phase, rank, world, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
ds = LMDBDataset(data)
log = open(f"{out}/{phase}-rank{rank}.jsonl", "w")

def step(images):  # a training step (DDP's all-reduce of the gradients); logs which samples it saw
    log.write(json.dumps([zlib.crc32(x.numpy().tobytes()) for x in images]) + "\n"); log.flush()
    dist.all_reduce(torch.ones(1))

if phase == "first":  # 2 ranks, Loader, batches of 2; killed after step 2
    loader = Loader(ds, 2, seed=SEED, threads=2)  # rank and world size from torch.distributed
    loader.set_epoch(EPOCH)
    for k, (images, _labels) in enumerate(loader, 1):
        step(images)
        if k == 2:
            if rank == 0:  # the checkpoint, next to the model's
                with open(f"{out}/ckpt.tmp", "w") as f:
                    json.dump({"loader": loader.state_dict()}, f)
                os.replace(f"{out}/ckpt.tmp", f"{out}/ckpt.json")
            dist.barrier()
            time.sleep(600)  # the job is killed here
else:  # 3 ranks, ResumableSampler in a DataLoader, batches of 3: the rest, then one whole epoch
    sampler = ResumableSampler(ds, 3, seed=SEED)
    sampler.load_state_dict(json.load(open(f"{out}/ckpt.json"))["loader"])
    for epoch in (EPOCH, EPOCH + 1):
        sampler.set_epoch(epoch)
        for images, _labels in DataLoader(ds, batch_size=3, sampler=sampler):
            step(images)
        log.write("end of epoch\n"); log.flush()
    dist.barrier()
    dist.destroy_process_group()
""".replace("SEED", str(SEED)).replace("EPOCH", str(EPOCH))


def start(phase: str, world: int, data: Path, out: Path) -> list[subprocess.Popen]:
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MASTER_ADDR": LOOPBACK}
    return [
        subprocess.Popen([sys.executable, "-c", RANK, str(data), str(out), phase, str(r), str(world), port], env=env,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
        for r in range(world)
    ]


def steps(out: Path, phase: str, rank: int, ids: dict[int, int]) -> list[list[int] | None]:
    """The dataset indices of each step a rank logged (``None``: the end of an epoch)."""
    lines = (out / f"{phase}-rank{rank}.jsonl").read_text().splitlines()
    return [[ids[c] for c in json.loads(line)] if line != "end of epoch" else None for line in lines]


def test_two_ranks_killed_then_three_ranks_resume_exactly(lmdb_32, tmp_path):
    ds = LMDBDataset(lmdb_32)
    ids = {zlib.crc32(ds[i][0].numpy().tobytes()): i for i in range(SAMPLES)}
    assert len(ids) == SAMPLES  # every sample's pixels differ: a checksum names the sample
    first = start("first", 2, lmdb_32, tmp_path)
    deadline = time.monotonic() + 120
    while not (tmp_path / "ckpt.json").exists() and time.monotonic() < deadline and all(p.poll() is None for p in first):
        time.sleep(0.1)
    # rank 1 logged its step 2 before the all-reduce that rank 0 finished before writing ckpt.json
    for p in first:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert (tmp_path / "ckpt.json").exists(), [p.stderr.read()[-2000:] for p in first]
    state = json.loads((tmp_path / "ckpt.json").read_text())["loader"]
    assert state["samples_consumed"] == 8 and state["epoch"] == EPOCH  # 2 steps of 2 x 2

    second = start("second", 3, lmdb_32, tmp_path)
    for p in second:
        assert p.wait(timeout=180) == 0, p.stderr.read()[-3000:]

    # what the first job read: 2 steps on each of 2 ranks; what the second read: the rest, then epoch 2
    head = [steps(tmp_path, "first", r, ids) for r in range(2)]
    assert [len(h) for h in head] == [2, 2]
    tails, nexts = [], []
    for r in range(3):
        log = steps(tmp_path, "second", r, ids)
        cut = log.index(None)
        tails.append(log[:cut])
        nexts.append(log[cut + 1 : -1])
    assert len({len(t) for t in tails}) == 1 and len({len(n) for n in nexts}) == 1  # equal steps: DDP never hangs
    # positions 0..7 of the epoch's global order before the kill, 8..17 after, each once
    order = EpochPlan(SAMPLES, 1, seed=SEED).order(EPOCH).tolist()
    assert sorted(i for h in head for batch in h for i in batch) == sorted(order[:8])
    padding = order[: -(SAMPLES - 8) % 3]  # the short last step's, so that every rank has 4 batches
    assert sorted(i for t in tails for batch in t for i in batch) == sorted(order[8:] + padding)
    # the next epoch is an uninterrupted 3-rank run's
    for r in range(3):
        plan = EpochPlan(SAMPLES, 3, seed=SEED, rank=r, world_size=3)
        assert nexts[r] == [batch.tolist() for batch in plan.batches(EPOCH + 1)]
