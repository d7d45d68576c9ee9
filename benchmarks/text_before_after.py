"""Text conversion before and after a change, side by side in one sitting: documents/s and the
driver's peak memory of two revisions converting the same JSON Lines corpus, in alternation (ABBA).

    python -m benchmarks.text_before_after --base bd87e9a               # the base revision vs this tree
    python -m benchmarks.text_before_after --base bd87e9a --docs 5000 --rounds 1   # a quick look

The corpus (``--docs`` JSON Lines records of 100-400 words, in files of 10,000 records, made
once under benchmarks/data/) is converted to the blob with all usable cores, with two
tokenizers: a byte-level BPE of 4,000 ids trained on the corpus (``bpe``: tokenising costs what
it usually does) and packer's ``bytes`` tokenizer (``bytes``: nearly free, so what is left is
moving documents). Each run is a fresh child process whose ``PYTHONPATH`` puts that tree's
``packer`` and ``readers`` first; it reports documents/s of the whole ``convert`` call and the
driver's peak resident memory (``VmHWM``: the process that scans the corpus and writes the
output, not its workers; not ``ru_maxrss``, which keeps the peak of the process it was forked
from). Median (min-max) over ``--rounds`` runs per side. Results go to
``benchmarks/out/text_before_after.json`` (``--update-results``: benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from .before_after import REPO, figure, in_turn, summary
from .common import DATA_DIR, OUT_DIR, RESULTS_DIR, cpu_count, machine, markdown_table, save_json, run_main
from .tokens import WORDS

_CONVERT = """
import json, sys, time
from packer import convert
from packer.options import TextOptions
src, dst, tokenizer, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
start = time.perf_counter()
report = convert(src, dst, format="blob", text=TextOptions(tokenizer=tokenizer), workers=workers)
seconds = time.perf_counter() - start
print(json.dumps({"rate": report.written / seconds, "tokens": report.tokens / seconds,
                  "peak_mib": int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024}))
"""

#: Records per corpus file.
PER_FILE = 10_000


def jsonl_corpus(docs: int) -> Path:
    """A cached folder of ``docs`` JSON Lines records ``{"id": i, "text": ...}`` of 100-400 words."""
    root = DATA_DIR / f"jsonl-corpus-{docs}"
    if (root / ".complete").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for first in range(0, docs, PER_FILE):
        with open(root / f"part-{first // PER_FILE:05d}.jsonl", "w", encoding="utf-8") as out:
            for i in range(first, min(docs, first + PER_FILE)):
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(100, 400)))
                out.write(json.dumps({"id": i, "text": text}) + "\n")
    (root / ".complete").touch()
    return root


def bpe_tokenizer(corpus: Path) -> Path:
    """A byte-level BPE of 4,000 ids trained on the corpus's first file (cached beside it)."""
    path = corpus.with_name(corpus.name + "-bpe.json")
    if not path.exists():
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        first = sorted(corpus.glob("*.jsonl"))[0]
        texts = [json.loads(line)["text"] for line in first.read_text(encoding="utf-8").splitlines()]
        tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=4000, special_tokens=["[UNK]", "<|endoftext|>"]))
        tokenizer.save(str(path))
    return path


def child(tree: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _CONVERT, *args], env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the revision to compare with")
    parser.add_argument("--docs", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=2, help="runs per side, alternating")
    parser.add_argument("--tokenizers", nargs="+", choices=["bpe", "bytes"], default=["bpe", "bytes"])
    parser.add_argument("--tag", default="", help="suffix of the result file's name (text_before_after-TAG.json)")
    parser.add_argument("--update-results", action="store_true", help="write benchmarks/results/ instead of benchmarks/out/")
    args = parser.parse_args()

    corpus = jsonl_corpus(args.docs)
    specs = {"bpe": str(bpe_tokenizer(corpus)), "bytes": "bytes"}
    corpus_mib = sum(p.stat().st_size for p in corpus.glob("*.jsonl")) / (1 << 20)
    workers = str(cpu_count())
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base_tree), args.base], check=True, capture_output=True)
        try:
            sides = {"before": base_tree, "after": REPO}
            for name in args.tokenizers:
                runs: dict[str, list[dict]] = {"before": [], "after": []}
                for round_ in range(args.rounds):
                    for side, tree in in_turn(sides, round_):
                        dst = Path(tmp) / f"{side}-{name}.blob"
                        dst.unlink(missing_ok=True)
                        runs[side].append(child(tree, str(corpus), str(dst), specs[name], workers))
                results[name] = {side: {key: summary([run[key] for run in r]) for key in ("rate", "tokens", "peak_mib")}
                                 for side, r in runs.items()}
                print(f"{name}: {_line(results[name])}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], check=False, capture_output=True)
    rows = [[name, figure(r["before"]["rate"]), figure(r["after"]["rate"]), f"{r['after']['rate']['median'] / r['before']['rate']['median']:.2f}",
             f"{r['before']['peak_mib']['median']:,.0f}", f"{r['after']['peak_mib']['median']:,.0f}"] for name, r in results.items()]
    print(markdown_table(["tokenizer", f"before ({args.base}) docs/s", "after docs/s", "after/before", "before peak MiB",
                          "after peak MiB"], rows))
    payload = {
        "command": " ".join(["python -m benchmarks.text_before_after", *sys.argv[1:]]),
        "base": args.base,
        "head": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "docs": args.docs,
        "corpus_mib": corpus_mib,
        "workers": int(workers),
        "rounds": args.rounds,
        "machine": machine(),
        "results": results,
    }
    name = f"text_before_after-{args.tag}" if args.tag else "text_before_after"
    print(f"wrote {save_json(name, payload, RESULTS_DIR if args.update_results else OUT_DIR)}")


def _line(result: dict) -> str:
    return (f"before {figure(result['before']['rate'])}, after {figure(result['after']['rate'])} docs/s; peak "
            f"{result['before']['peak_mib']['median']:,.0f} -> {result['after']['peak_mib']['median']:,.0f} MiB")


if __name__ == "__main__":
    run_main(main)
