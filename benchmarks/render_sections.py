"""The tables of benchmarks/RESULTS.md, each rendered from committed JSON in benchmarks/results/.

Every section starts with a source line: the JSON file, the command that wrote it, the machine,
the date and the commit stored in the JSON. ``benchmarks.render`` puts them between the
``<!-- render:NAME -->`` markers of RESULTS.md; nothing here measures anything.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from .common import RESULTS_DIR, markdown_table

__all__ = ["SECTIONS", "load", "source_line", "rate", "machine_words"]


def load(name: str) -> dict[str, Any]:
    """benchmarks/results/NAME.json."""
    return json.loads((RESULTS_DIR / f"{name}.json").read_text())


def machine_words(m: dict[str, Any]) -> str:
    gpu = f", {m['gpu']}" if m.get("gpu") else ", no GPU"
    return f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB{gpu}, torch {m['torch']}"


def source_line(*names: str) -> str:
    """``Source: file (command; machine; date; commit)`` for each JSON behind a table."""
    parts = []
    for name in names:
        d = load(name)
        commit = d.get("commit") or d.get("head")
        if commit:
            when = f"commit {commit}" + (f" (the tree of {d['tree_commit']})" if d.get("tree_commit") not in (None, commit) else "")
        else:
            when = f"committed in {d['committed_in']} (provenance added from git history)"
        parts.append(f"`benchmarks/results/{name}.json`, written by `{d['command']}`; {machine_words(d['machine'])}; "
                     f"{d['date']}; {when}")
        note = d.get("note") or (d.get("provenance_note") if d.get("tree_commit") else "") or ""
        if note:
            parts[-1] += f". Note: {note}"
    return "Source: " + ". ".join(parts) + "."


def rate(r: dict[str, Any], scale: float = 1.0, digits: int = 0) -> str:
    """``median (min-max)``."""
    f = lambda v: f"{v * scale:,.{digits}f}"  # noqa: E731
    return f"{f(r['median'])} ({f(r['min'])}-{f(r['max'])})"


def _machine() -> str:
    """The development VM, from the suite's JSON (and the copy bandwidth from the loader's)."""
    m = load("full")["machine"]
    rows = [["CPU", f"{m['cpu']} (virtual), {m['cores']} cores"], ["memory", f"{m['memory_gib']} GiB"],
            ["OS", f"{m['os']}, **no GPU**"], ["Python, torch", f"{m['python']}, torch {m['torch']}"],
            ["libraries", f"numpy {m['numpy']}, OpenCV {m['opencv']}, Pillow {m['pillow']}, lmdb {m['lmdb']}, h5py {m.get('h5py', '?')}"],
            ["peers", f"webdataset {m.get('webdataset')}, mosaicml-streaming {m.get('mosaicml-streaming')}, litdata {m.get('litdata')} (installed with `--no-deps`)"]]
    return source_line("full") + "\n\n" + markdown_table(["", ""], rows)


def _full() -> str:
    from .run import render  # the suite's own report, as `python -m benchmarks.run --render` prints it

    return source_line("full") + "\n\n" + render(load("full")).strip()


def _storage_tradeoff() -> str:
    """README "Which format?": size on disk against read rate, raw and JPEG storage (full.json)."""
    d = load("full")
    images = d["images"]
    rows = []
    for fmt in ("lmdb", "hdf5", "blob", "webdataset"):
        for encoding in ("raw", "jpeg"):
            name = f"packer {fmt} ({encoding})"
            reads = [r for r in d["read"] if r["pipeline"] == name]
            if not reads:
                continue
            loader = next(r for r in reads if r["reader"] == "readers.Loader")
            plain = max((r for r in reads if r["reader"].startswith("DataLoader")), key=lambda r: r["median"])
            rows.append([f"`{fmt}`", encoding, f"{loader['bytes'] / images / 1e3:,.0f} KB",
                         f"{loader['bytes'] / d['folder_bytes']:.2f}x", rate(loader), f"{rate(plain)}, {plain['reader'].split('num_workers=')[1].rstrip(')')} workers"])
    head = (f"The same {images:,} ImageNet-like JPEGs (source folder {d['folder_bytes'] / images / 1e3:,.0f} KB an image) "
            f"stored at 224x224, read on the CPU ({d['cores']} cores, no GPU), images/s median (min-max):")
    return "\n\n".join([source_line("full"), head, markdown_table(
        ["format", "stored", "on disk an image", "vs the source folder", "readers.Loader", "DataLoader, best num_workers"], rows)])


def _convert_rates() -> str:
    d = load("convert_rates")
    by_tool: dict[str, dict[int, str]] = {}
    for row in d["rows"]:
        by_tool.setdefault(row["tool"], {})[row["workers"]] = rate(row["rate"])
    workers = sorted({w for cells in by_tool.values() for w in cells})
    rows = [[tool] + [cells.get(w, "") for w in workers] for tool, cells in by_tool.items()]
    head = f"{d['images']:,} ImageNet-like JPEGs to {d['size']}x{d['size']} {d['encoding']}, images/s, median (min-max) of {d['repeats']} whole conversions:"
    return "\n\n".join([source_line("convert_rates"), head,
                        markdown_table(["tool"] + [f"{w} worker{'s' if w > 1 else ''}" for w in workers], rows)])


def _loader() -> str:
    d = load("loader")
    copies = d["copy_bytes_per_s"]
    lines = [source_line("loader"), "",
             f"{d['images']:,} raw 224x224x3 samples, batch {d['batch']}. Memory copy bandwidth, GB/s: "
             + ", ".join(f"{t} thread(s) {rate(r, 1e-9, 1)}" for t, r in copies.items()) + ".", ""]
    rows = []
    for fmt in ("blob", "lmdb", "hdf5"):
        if fmt not in d:
            continue
        r = d[fmt]
        share = r["loader"]["median"] * d["sample_bytes"] / d["copy_limit_bytes_per_s"]
        slow = r.get("per_sample_dataloader")
        rows.append([fmt, rate(r["loader"]), f"{share:.0%}", rate(slow) if slow else "", f"{r['speedup']:.1f}x" if slow else ""])
    lines += [markdown_table(["reader", "Loader, images/s", "of the fastest copy", "DataLoader per-sample, 0 workers", "Loader vs DataLoader"], rows)]
    if "lmdb_by_threads" in d:
        t = d["lmdb_by_threads"]
        lines += ["", "Loader over LMDB by thread count, images/s:", "",
                  markdown_table(["threads"] + list(t), [["images/s"] + [rate(r) for r in t.values()]])]
    return "\n".join(lines)


def _loader_ceiling(tag: str = "") -> Callable[[], str]:
    return lambda: _ceiling_section("loader_ceiling" + (f"-{tag}" if tag else ""))


def _ceiling_section(name: str) -> str:
    d = load(name)
    pct = lambda r: f"{r['median']:.0%} ({r['min']:.0%}-{r['max']:.0%})"  # noqa: E731
    rows = [[f"{fmt}, buffers={mode!r}", rate(e["images_per_s"]), pct(e["of_random_rows"]), pct(e["of_contiguous"]),
             pct(e["of_recycle"]) if "of_recycle" in e else ""]
            for fmt, modes in d["loader"].items() for mode, e in modes.items()]
    c = d["ceilings"]
    return "\n".join([
        source_line(name), "",
        (f"Run with `GLIBC_TUNABLES={d['glibc_tunables']}`. " if d.get("glibc_tunables") else "")
        + f"{d['images']:,} raw 224x224x3 samples, batch {d['batch']}, {d['rounds']} interleaved rounds of {d['seconds']:g} s, "
        f"load average per round {', '.join(f'{x:g}' for x in d['load_average_per_round'])} on {d['cores']} cores. "
        f"Ceilings, images/s: (a) {d['ceiling_threads']} threads copying random rows {rate(c['random_rows'])}, "
        f"(b) the same threads copying consecutive rows {rate(c['contiguous'])}. Shares are per round, then median (min-max).", "",
        markdown_table(["Loader", "images/s", "of (a)", "of (b)", "checked / recycle"], rows), "",
        "Targets (issue 20): the blob at 80% of (a) or more (70% of (b)), LMDB and HDF5 at 60% of (a) or more, "
        "`\"checked\"` within 5% of `\"recycle\"`."])


def _gpu() -> str:
    runs = {"gpu": load("gpu"), "gpu-run1": load("gpu-run1")}
    second, first = runs["gpu"], runs["gpu-run1"]

    def cell(key: str, group: str, scale: float, digits: int, base: str | None = None) -> str:
        out = rate(second[group][key], scale, digits)
        if key in first[group]:
            out += f" [{first[group][key]['median'] * scale:,.{digits}f}]"
        return out

    pinned = {n: r["copy_gb_per_s"]["pinned"]["median"] for n, r in runs.items()}
    rows = [["one batch from pinned memory (the card's rate)", cell("pinned", "copy_gb_per_s", 1e-9, 1), "100%"],
            ["the same from pageable memory", cell("pageable", "copy_gb_per_s", 1e-9, 1),
             f"{second['copy_gb_per_s']['pageable']['median'] / pinned['gpu']:.0%}"]]
    for key in second["delivery_gb_per_s"]:
        shares = [f"{r['delivery_gb_per_s'][key]['median'] / pinned[n]:.0%}" for n, r in runs.items() if key in r["delivery_gb_per_s"]]
        rows.append([key, cell(key, "delivery_gb_per_s", 1e-9, 1), " [".join(shares) + ("]" if len(shares) > 1 else "")])
    resident = {n: r["resnet50_img_per_s"]["batch already on the GPU"]["median"] for n, r in runs.items()}
    steps = []
    for key in second["resnet50_img_per_s"]:
        shares = [f"{r['resnet50_img_per_s'][key]['median'] / resident[n]:.1%}" for n, r in runs.items() if key in r["resnet50_img_per_s"]]
        steps.append([key, cell(key, "resnet50_img_per_s", 1, 0), " [".join(shares) + ("]" if len(shares) > 1 else "")])
    conv = ", ".join(f"{k} {v:,}" for k, v in second["convert_img_per_s"].items())
    return "\n".join([
        source_line("gpu", "gpu-run1"), "",
        f"{second['images']:,} raw 224x224x3 samples, batch {second['batch']}; median (min-max) of the second run, "
        "the first run's median in brackets.", "",
        markdown_table(["host -> device", "GB/s", "of the pinned copy"], rows), "",
        markdown_table(["ResNet-50 training step, bf16, batch 256", "img/s", "of resident data"], steps), "",
        f"Conversion on that machine's 16 cores in the second run, img/s: {conv}.",
    ])


def _train_loop() -> str:
    from .train_loop import render

    return source_line("train_loop") + "\n\n" + render(load("train_loop"))


def _tokens() -> str:
    d = load("tokens")
    r = d["rates"]
    base = r["on_the_fly"]["median"]
    rows = [["packer convert (blob, BPE 4k)", rate(r["convert"]), ""],
            [f"TokenDataset blocks ({d['block_size']}), DataLoader x{d['workers']}", rate(r["dataloader"]), f"{r['dataloader']['median'] / base:.1f}x"],
            [f"TokenDataset blocks ({d['block_size']}), readers.Loader", rate(r["loader"]), f"{r['loader']['median'] / base:.1f}x"],
            [f"raw text + tokenise in __getitem__, DataLoader x{d['workers']}", rate(r["on_the_fly"]), "1.0x"]]
    return "\n\n".join([source_line("tokens"), f"{d['docs']:,} documents, block {d['block_size']}, tokens/s median (min-max):",
                        markdown_table(["pipeline", "tokens/s", "vs tokenising on the fly"], rows)])


def _blob_memory() -> str:
    d = load("blob_memory")
    rows = [[r["mode"], r["context"], f"{r['load_s']:.2f}", f"{r['epoch_s']:.2f}", " + ".join(f"{p:.0f}" for p in r["pss_mib"]),
             f"{r['total_pss_mib']:.0f}", "-" if r["blob_mapping_pss_mib"] is None else f"{r['blob_mapping_pss_mib']:.0f}",
             "-" if r["mode"] == "baseline" else f"{r['extra_over_baseline_mib']:.0f} ({r['extra_in_blob_sizes']:.2f}x)"]
            for r in d["results"]]
    return "\n\n".join([source_line("blob_memory"),
                        f"{d['samples']:,} raw samples = {d['blob_mib']:,.0f} MiB; {d['workers']} DataLoader workers, one shuffled epoch; PSS in MiB.",
                        markdown_table(["mode", "start", "load s", "epoch s", "PSS parent + workers", "total PSS", "blob mappings PSS", "extra vs baseline"], rows)])


def _one_writer() -> str:
    d = load("one_writer")
    rows = [[name, rate(r), f"{r['median'] * d['sample_bytes'] / 1e6:,.0f}"] for name, r in d["rates"].items()]
    return "\n\n".join([source_line("one_writer"), f"{d['samples']:,} samples of {d['sample_bytes']:,} bytes, decoding taken away:",
                        markdown_table(["what", "samples/s, median (min-max)", "MB/s"], rows)])


def _one_writer_before_after(name: str = "one_writer-before_after") -> Callable[[], str]:
    def section() -> str:
        d = load(name)
        runs = lambda values: " / ".join(f"{v:,.0f}" for v in values) or "(not in the base)"  # noqa: E731
        rows = [[row, runs(r["before"]), runs(r["after"])] for row, r in d["rates"].items()]
        return "\n\n".join([source_line(name), f"base {d['base']}, after {d['after']}:",
                             markdown_table(["row (samples/s)", "before", "after"], rows)])

    return section


def _core_scaling(name: str = "core_scaling") -> Callable[[], str]:
    def section() -> str:
        from .core_scaling import render  # the benchmark's own table

        return source_line(name) + "\n\n" + render(load(name))

    return section


def _ray_vs_local() -> str:
    d = load("ray_vs_local")
    rows = [[fmt, d["args"]["workers"], f"{m['local']:,.0f}", f"{m['ray']:,.0f}", f"{1 - m['ray'] / m['local']:+.1%}"]
            for fmt, m in d["mean_rates"].items()]
    return "\n\n".join([source_line("ray_vs_local"),
                        f"{d['args']['images']:,} images at {d['args']['size']}x{d['args']['size']} raw; Ray start-up {d['ray_start_s']:.1f} s (not timed):",
                        markdown_table(["format", "workers", "local img/s", "ray img/s", "ray overhead"], rows)])


def _remote_blob() -> str:
    d = load("remote_blob")
    local = next(iter(d["rows"].values()))["rate"]["median"]
    rows = [[name, rate(r["rate"]), f"{r['rate']['median'] / local:.2f}x", f"{r['peak_local_bytes'] / 1e6:,.0f} MB ({r['peak_local_bytes'] / d['blob_bytes']:.0%})"]
            for name, r in d["rows"].items()]
    return "\n\n".join([source_line("remote_blob"), f"{d['images']:,} images, a {d['blob_bytes'] / 1e6:,.0f} MB blob; img/s, median (min-max):",
                        markdown_table(["DST", "img/s", "vs local", "peak local disk (of the blob)"], rows)])


def _remote_src() -> str:
    d = load("remote_src")
    local = next(r for name, r in d["rates"].items() if name.startswith("(d)"))["median"]
    rows = [[name, rate(r), f"{r['median'] / local:.2f}x" if name.startswith("(c)") else ""] for name, r in d["rates"].items()]
    return "\n\n".join([source_line("remote_src"),
                        f"{d['images']:,} images, {d['latency_s'] * 1e3:g} ms per GET; listing the SRC took {d['listing_s']:.2f} s, "
                        f"the HTTP server used {d['server_cpu_s_per_pass']:.1f} s of CPU per pass:",
                        markdown_table(["what", "img/s, median (min-max)", "vs local folder"], rows)])


def _before_after(tag: str = "") -> Callable[[], str]:
    name = "before_after" + (f"-{tag}" if tag else "")

    def section() -> str:
        d = load(name)
        rows = [[job, fmt, rate(side["before"]), rate(side["after"]), f"{side['after']['median'] / side['before']['median']:.2f}"]
                for job in ("convert", "loader", "cold") for fmt, side in d.get(job, {}).items()]
        return "\n\n".join([source_line(name), f"{d['base']} (before) against {d['head']} (after), alternating, {d['rounds']} rounds; images/s, median (min-max):",
                            markdown_table(["job", "format", "before", "after", "after/before (medians)"], rows)])

    return section


def _text_before_after() -> str:
    d = load("text_before_after")
    rows = [[name, rate(r["before"]["rate"]), rate(r["after"]["rate"]), f"{r['after']['rate']['median'] / r['before']['rate']['median']:.2f}",
             rate(r["before"]["peak_mib"]), rate(r["after"]["peak_mib"])] for name, r in d["results"].items()]
    return "\n\n".join([source_line("text_before_after"), f"{d['base']} (before) against {d['head']} (after), alternating, {d['rounds']} rounds, "
                         f"{d['docs']:,} JSON Lines documents ({d['corpus_mib']:,.0f} MiB) to the blob with {d['workers']} workers; "
                         "median (min-max):", markdown_table(["tokenizer", "before docs/s", "after docs/s", "after/before (medians)",
                                                              "before: driver peak MiB", "after: driver peak MiB"], rows)])


def _verify_cost() -> str:
    d = load("verify_cost")
    rows = [[r["format"], r["encoding"], r["reader"], rate(r["off"]), rate(r["on"]),
             f"{r['cost']:.1%} ({min(r['pair_costs']):.1%} to {max(r['pair_costs']):.1%})"] for r in d["results"]]
    return "\n\n".join([source_line("verify_cost"), markdown_table(
        ["format", "storage", "reader", "verify off (img/s)", "verify on (img/s)", "cost: median (min to max) over pairs"], rows)])


def _archive() -> str:
    d = load("archive_vs_folder")
    rows = [[src, rate(r["images_per_s"]), f"{r['vs_folder']['median']:.2f}x ({r['vs_folder']['min']:.2f}-{r['vs_folder']['max']:.2f})"]
            for src, r in d["results"].items()]
    return "\n\n".join([source_line("archive_vs_folder"),
                        f"{d['images']:,} JPEGs to {d['format']} at {d['size']}x{d['size']} {d['encoding']}, {d['workers']} workers, {d['rounds']} rounds:",
                        markdown_table(["source", "img/s, median (min-max)", "speed vs the folder, same round: median (min-max)"], rows)]
                       + ([f"The `.tar.gz`'s streaming pass alone took {share['median']:.0%} ({share['min']:.0%}-{share['max']:.0%}) "
                           "of the folder's conversion time, same rounds."]
                          if (share := d.get("tar.gz_pass", {}).get("share_of_folder_conversion")) else []))


def _faults() -> str:
    d = load("faults")
    lost = sum(s["data_lost"] for s in d["summary"])
    return source_line("faults") + f"\n\n{len(d['trials'])} trials, data lost: {lost}."


def _faults_table() -> str:
    from .faults import render

    return source_line("faults") + "\n\n" + render(load("faults")).split("\n\n")[0]


def _preprocess() -> str:
    d = load("preprocess-quick")
    rows = [[r["set"], r["method"], rate(r), f"{r['psnr_db']:.2f}"] for r in d["rows"]]
    return "\n\n".join([source_line("preprocess-quick"), markdown_table(
        ["images", "method", "images/s median (min-max), 1 thread", "PSNR vs float Lanczos (dB)"], rows)])


def _gpu_resize() -> str:
    rows = [[r["set"], r["method"], f"{r['psnr_db']:.2f} ({r['psnr_db_min']:.1f}-{r['psnr_db_max']:.1f})",
             f"{r['vs_cpu_path_db']:+.2f}" if "vs_cpu_path_db" in r else ""] for r in load("gpu_resize")["rows"]]
    return "\n\n".join([source_line("gpu_resize"), markdown_table(
        ["images", "method", "PSNR vs float Lanczos (dB), mean (min-max)", "vs CPU path (dB)"], rows)])


def _jpeg_read() -> str:
    d = load("jpeg_read")
    x = lambda r: f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"  # noqa: E731
    rows = [[f"{name} pool", rate(p["images_per_s"]), x(p["of_pillow_pool"]), "", ""] for name, p in d["pools"].items()]
    for fmt, e in d["loader"].items():
        rows.append([f"{fmt} `Loader`, Pillow only", rate(e["pillow"]["images_per_s"]), x(e["pillow"]["of_pillow_pool"]), "", ""])
        new = e["simplejpeg"]
        rows.append([f"{fmt} `Loader`, simplejpeg", rate(new["images_per_s"]), x(new["of_pillow_pool"]), x(new["of_loader_pillow"]),
                     x(new["vs_ffcv_reference"])])
    ffcv = d["ffcv_reference"]
    return "\n\n".join([source_line("jpeg_read"), f"{d['images']:,} samples stored as JPEG q{d['stored']['quality']}, "
                         f"{d['threads']} threads, batches of {d['batch']}, {d['rounds']} rounds; images/s and ratios median (min-max); "
                         f"decoded pixels identical to Pillow's: {d['decoding']['identical_to_pillow']}:",
                         markdown_table(["reader", "images/s", "of the Pillow pool", "of `Loader` Pillow only",
                                         f"of FFCV's {ffcv['images_per_s']:,} ({ffcv['source']})"], rows)])


def _gpu_decode() -> str:
    from .gpu_decode import render  # the benchmark's own tables

    d, before = load("gpu_decode"), load("gpu_decode-before")
    c, b = d["convert"]["agreement"], before["convert"]["images_per_s"]
    return "\n\n".join([source_line("gpu_decode", "gpu_decode-before"), render(d),
                         f"GPU-converted pixels against the CPU path's: PSNR {c['psnr_db_between']:.1f} dB between them, mean difference "
                         f"{c['mean_abs_diff']:.2f} levels; nvJPEG on read against the CPU decode: {d['read']['agreement']['share_equal']:.2%} "
                         f"of pixels equal, at most {d['read']['agreement']['max_abs_diff']} level apart. Before the fixes of "
                         f"{d['tree_commit']} (`gpu_decode-before.json`, the tree of {before['tree_commit']}), the GPU conversion ran at {rate(b['cuda'])} "
                         f"against the CPU path's {rate(b['cpu'])} in the same run."])


def _gpu_storage() -> str:
    """README "Which format?": raw against JPEG storage on a GPU host, decoded on the CPU or the GPU (gpu_decode.json)."""
    d = load("gpu_decode")
    r, images = d["read"], d["images"]
    on = {"cpu decode": f"CPU, {d['threads']} threads", "cuda decode": "GPU (nvJPEG)"}
    rows = [[name.split(",")[0].split()[1].join("``"), name.split()[0], on[name.split(", ")[1]] if "," in name else "(nothing to decode)",
             f"{r['bytes_on_disk'][name.split(',')[0]] / images / 1e3:,.0f} KB", rate(rates)] for name, rates in r["images_per_s"].items()]
    return "\n\n".join([source_line("gpu_decode"), f"The same {images:,} images at 224x224 on a GPU host ({d['machine']['gpu']}, "
                         f"{d['machine']['cores']} cores), `Loader(device=\"cuda\")` batches of {d['batch']} with {d['threads']} threads, "
                         "images/s median (min-max):",
                         markdown_table(["format", "stored", "decoded on", "on disk an image", "readers.Loader to the GPU"], rows)])


def _wds_tail() -> str:
    """WebDataset's last-round fragments, before and after, alternated (core_scaling-wds-tail-*.json)."""
    names = [f"core_scaling-wds-tail-{when}-{k}" for k in (1, 2) for when in ("before", "after")]
    rows = [[name.rsplit("-", 2)[1], load(name)["commit"], rate(load(name)["rates"]["work alone"]["2"]), rate(load(name)["rates"]["webdataset"]["2"]),
             "{median:.0%} ({min:.0%}-{max:.0%})".format(**load(name)["shares"]["webdataset"]["2"])] for name in names]
    d = load(names[0])
    return "\n\n".join([source_line(*names), f"{d['images']:,} ImageNet-like JPEGs, {d['shard_size']} a shard ({-(-d['images'] // d['shard_size'])} "
                         f"shards), 2 workers, {d['rounds']} rounds each, runs in the order listed, images/s median (min-max):",
                         markdown_table(["code", "commit", "work alone", "webdataset", "share"], rows)])


#: RESULTS.md block name -> its renderer.
SECTIONS: dict[str, Callable[[], str]] = {
    "machine": _machine,
    "convert_rates": _convert_rates,
    "full": _full,
    "loader": _loader,
    "loader_ceiling": _loader_ceiling(),
    "loader_ceiling-nt": _loader_ceiling("nt"),
    "loader_ceiling-2026-11-25": _loader_ceiling("2026-11-25"),
    "gpu": _gpu,
    "tokens": _tokens,
    "blob_memory": _blob_memory,
    "train_loop": _train_loop,
    "one_writer": _one_writer,
    "one_writer-before_after": _one_writer_before_after(),
    "one_writer-lmdb-write-behind": _one_writer_before_after("one_writer-lmdb-write-behind"),
    "core_scaling": _core_scaling(),
    "core_scaling-presized": _core_scaling("core_scaling-presized"),
    "core_scaling-16cores": _core_scaling("core_scaling-16cores"),
    "core_scaling-16cores-2026-11-25": _core_scaling("core_scaling-16cores-2026-11-25"),
    "core_scaling-wds-tail": _wds_tail,
    "gpu_decode": _gpu_decode,
    "gpu_storage": _gpu_storage,
    "ray_vs_local": _ray_vs_local,
    "remote_blob": _remote_blob,
    "remote_src": _remote_src,
    "preprocess": _preprocess,
    "gpu_resize": _gpu_resize,
    "jpeg_read": _jpeg_read,
    "before_after": _before_after(),
    "before_after-convert-recheck": _before_after("convert-recheck"),
    "before_after-elastic": _before_after("elastic"),
    "before_after-direct-jpeg": _before_after("direct-jpeg"),
    "before_after-direct-presized": _before_after("direct-presized"),
    "before_after-lmdb-cold": _before_after("lmdb-cold"),
    "text_before_after": _text_before_after,
    "verify_cost": _verify_cost,
    "faults": _faults,
    "faults_table": _faults_table,
    "archive_vs_folder": _archive,
    "storage_tradeoff": _storage_tradeoff,
}

