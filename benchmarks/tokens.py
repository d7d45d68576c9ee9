"""Text: tokens/s of ``packer convert`` and of reading training blocks vs tokenising on the fly.

One run, same machine, same DataLoader workers: ``TokenDataset(blob, block_size)`` batches against
a Dataset that reads each raw document and tokenises it with the same Hugging Face tokenizer in
``__getitem__`` (the usual pipeline packer replaces). Tokens are counted as delivered to the
training loop. ``--short`` for a quick check on a loaded machine.

    python -m benchmarks.tokens [--short]
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

import packer
from packer.options import StorageOptions, TextOptions
from readers import Loader, TokenDataset
from readers.tokenizer import load_tokenizer

from .common import add_output_arguments, cpu_count, machine, markdown_table, measure, output_dir, save_json, run_main

WORDS = [f"w{i}{s}" for i in range(400) for s in ("", "ing", "ed")]


def make_corpus(root: Path, docs: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(docs):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(100, 400)))
        (root / f"{i:06d}.txt").write_text(text, encoding="utf-8")


def train_tokenizer(path: Path, corpus: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    files = sorted(str(p) for p in corpus.glob("*.txt"))[:200]
    tok.train(files, trainers.BpeTrainer(vocab_size=4000, special_tokens=["[UNK]", "<|endoftext|>"]))
    tok.save(str(path))


class OnTheFly(Dataset):
    """The baseline: read a raw document and tokenise it per item."""

    def __init__(self, files: list[Path], tokenizer: str) -> None:
        self.files, self.spec, self.tok = files, tokenizer, None

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.tok is None:
            self.tok = load_tokenizer(self.spec)
        return torch.tensor(self.tok.encode(self.files[i].read_text(encoding="utf-8")), dtype=torch.int64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--short", action="store_true", help="small corpus, one repeat")
    parser.add_argument("--workers", type=int, default=min(4, cpu_count()))
    add_output_arguments(parser)
    args = parser.parse_args()
    docs, repeats, block, batch = (400, 1, 256, 32) if args.short else (5000, 3, 1024, 32)
    workers = args.workers
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        corpus = tmp_path / "corpus"
        make_corpus(corpus, docs)
        tok_path = tmp_path / "tokenizer.json"
        train_tokenizer(tok_path, corpus)
        dst = tmp_path / "c.blob"

        def convert() -> int:
            report = packer.convert(corpus, dst, text=TextOptions(tokenizer=str(tok_path)), workers=workers, overwrite=True,
                                    storage=StorageOptions())
            return report.tokens

        convert_rate = measure(convert, repeats=repeats, warmup=0)

        packed = TokenDataset(dst, block_size=block)

        def read_packed() -> int:
            loader = DataLoader(packed, batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=False)
            return sum(x.numel() for x, _y in loader)

        def read_loader() -> int:
            with Loader(packed, batch_size=batch, shuffle=True) as loader:
                return sum(x.numel() for x, _y in loader)

        raw = OnTheFly(sorted(corpus.glob("*.txt")), str(tok_path))

        def read_raw() -> int:
            loader = DataLoader(raw, batch_size=None, shuffle=True, num_workers=workers)
            return sum(t.numel() for t in loader)

        packed_rate = measure(read_packed, repeats=repeats)
        loader_rate = measure(read_loader, repeats=repeats)
        raw_rate = measure(read_raw, repeats=repeats)
    ratio = packed_rate.median / raw_rate.median
    loader_ratio = loader_rate.median / raw_rate.median

    def cells(rate) -> str:
        return f"{rate.median:,.0f} ({rate.min:,.0f} .. {rate.max:,.0f})"

    rows = [
        ("packer convert (blob, BPE 4k)", cells(convert_rate), "-"),
        (f"TokenDataset blocks ({block}), DataLoader x{workers}", cells(packed_rate), f"{ratio:,.1f}x"),
        (f"TokenDataset blocks ({block}), readers.Loader", cells(loader_rate), f"{loader_ratio:,.1f}x"),
        (f"raw text + tokenise in __getitem__, DataLoader x{workers}", cells(raw_rate), "1.0x"),
    ]
    print(markdown_table(("pipeline", "tokens/s median (min .. max)", "vs on the fly"), rows))
    path = save_json("tokens", {"machine": machine(), "short": args.short, "docs": docs, "workers": workers, "block_size": block,
                                "convert_tokens_per_s": convert_rate.median, "packed_tokens_per_s": packed_rate.median,
                                "loader_tokens_per_s": loader_rate.median, "raw_tokens_per_s": raw_rate.median,
                                "ratio": ratio, "loader_ratio": loader_ratio,
                                "rates": {"convert": convert_rate, "dataloader": packed_rate, "loader": loader_rate, "on_the_fly": raw_rate}},
                     output_dir(args.update_results, args.out))
    print(f"saved {path}")


if __name__ == "__main__":
    run_main(main)
