"""Language-model pretraining from a tokenised corpus: pack the text once, train on token blocks.

    python examples/pretrain_tokens.py                           # a made-up corpus, bytes tokenizer
    python examples/pretrain_tokens.py --corpus my_texts/ --tokenizer tokenizer.json --steps 2000
    python examples/pretrain_tokens.py --checkpoint run.pt --steps 100   # stop; run again to go on

``packer.convert(corpus, "corpus.blob", text=TextOptions(...))`` tokenises the corpus once (in
parallel; each document's ids, then the end-of-document id), and ``TokenDataset(blob,
block_size=..., random_windows=True)`` serves windows of the token stream: ``block_size`` input
ids and their next-token targets, drawn afresh each epoch from the seed, as nanoGPT's
``get_batch`` draws them. A small causal transformer trains on them through ``readers.Loader``;
with ``--checkpoint run.pt`` the model, the optimizer and the loader's position are saved after
every step (atomically), the corpus is packed once into ``run.blob`` beside it, and a later run
continues the same stream of windows exactly. Under
``torchrun`` the same ``Loader`` splits every epoch across the ranks.

Without ``--corpus`` a corpus is made up here: sentences from a tiny grammar, so the loss falls
well below that of guessing uniformly among the bytes (``ln 257``, about 5.55).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import packer
from readers import Loader, TokenDataset, WidenTokens

SUBJECTS = ["the cat", "a dog", "my neighbour", "the old sailor", "every child", "the robot"]
VERBS = ["sees", "likes", "paints", "follows", "carries", "forgets"]
OBJECTS = ["a red ball", "the blue door", "an apple", "the long road", "a paper boat", "the moon"]


def make_corpus(folder: Path, files: int = 20, lines: int = 200, seed: int = 0) -> Path:
    """``files`` text files of ``lines`` sentences each (one document per line with ``lines=True``)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        text = "".join(f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}.\n" for _ in range(lines))
        (folder / f"part-{f:03d}.txt").write_text(text, encoding="utf-8")
    return folder


class TinyGPT(nn.Module):
    """Token and position embeddings, a few causal self-attention blocks, a linear head."""

    def __init__(self, vocab: int, block: int, width: int = 128, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(block, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(block), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(n, device=ids.device))
        return self.head(self.blocks(x, mask=self.mask[:n, :n], is_causal=True))


def train(blob: Path, *, block_size: int, batch_size: int, steps: int, lr: float, checkpoint: Path | None) -> float:
    """Train until ``steps``; the last step's loss."""
    torch.manual_seed(0)
    blocks = TokenDataset(blob, block_size=block_size, random_windows=True, seed=0)
    vocab = blocks.meta.tokenizer["vocab_size"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loader = Loader(blocks, batch_size, shuffle=True, seed=0, drop_last=True, device=device)
    widen = WidenTokens()  # uint16/uint32 ids to int64, after the copy to the device
    model = TinyGPT(vocab, block_size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    print(f"data: {blob} ({len(blocks):,} blocks of {block_size} tokens, vocabulary {vocab:,}); device: {device}")
    step, epoch, loss_value = 0, 0, float("nan")
    if checkpoint is not None and checkpoint.exists():
        saved = torch.load(checkpoint, map_location=device)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        step, epoch, loss_value = saved["step"], saved["loader"]["epoch"], saved["loss"]
        print(f"resumed from {checkpoint}: step {step}")
    start, tokens = time.perf_counter(), 0
    while step < steps:
        loader.set_epoch(epoch)  # the same epoch keeps a loaded position: the rest of it
        for windows, _starts in loader:  # (batch, block_size + 1) ids
            ids = widen(windows)
            logits = model(ids[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step, tokens, loss_value = step + 1, tokens + ids[:, :-1].numel(), loss.item()
            if checkpoint is not None:  # the loader's position beside the model's, written atomically
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "loss": loss_value,
                         "loader": loader.state_dict()}
                torch.save(state, f"{checkpoint}.tmp")
                os.replace(f"{checkpoint}.tmp", checkpoint)
            if step % 20 == 0 or step == 1 or step == steps:
                print(f"step {step}: loss {loss_value:.3f}, {tokens / (time.perf_counter() - start):,.0f} tokens/s")
            if step >= steps:
                break
        else:
            epoch += 1
    print(f"done: {step} steps, loss {loss_value:.3f} (uniform guessing: {math.log(vocab):.3f})")
    return loss_value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, help="a folder of .txt/.jsonl/.parquet files (default: one made up here)")
    parser.add_argument("--tokenizer", default="bytes", help="'bytes', a tokenizer.json or a SentencePiece .model")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--checkpoint", type=Path, help="save after every step; a run that finds it goes on from it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="packer-pretrain-") as tmp:
        # packed once: beside the checkpoint, the next run trains on the same blob (else a temporary one)
        blob = args.checkpoint.with_suffix(".blob") if args.checkpoint else Path(tmp) / "corpus.blob"
        if not blob.exists():
            corpus = args.corpus or make_corpus(Path(tmp) / "corpus")
            report = packer.convert(corpus, blob, text=packer.TextOptions(tokenizer=args.tokenizer, lines=True))
            print(f"packed {report.written:,} documents, {report.tokens:,} tokens in {report.seconds:.1f} s ({report.workers} workers)")
        train(blob, block_size=args.block_size, batch_size=args.batch_size, steps=args.steps, lr=args.lr, checkpoint=args.checkpoint)


if __name__ == "__main__":
    main()
