"""How to split one GPU between several vLLM servers of the same model: the
speculative/baseline pair (`plan_split`), or N speculation configurations, one
server per route (`plan_servers`: none, ngram-k2, eagle3-k3, ... on one GPU).

Every server loads the same target weights; a speculative one also loads its
draft (nothing for n-gram or MTP, a small head for EAGLE/EAGLE3, a whole small
model for draft_model). What is left after weights, per-server overheads and
reserves is KV cache, divided between the servers by weight: a speculative
server weighs `speculative_kv_share` (0.4), one without speculation 1 - that
(0.6), since the gateway sends the overflow (busy, KV pressure) to plain
decoding. For the pair that is the 40/60 split; for none + two speculative
routes 0.6/0.4/0.4 of the KV memory, normalised.

vLLM's `--gpu-memory-utilization` is a per-instance fraction of the GPU's
*total* memory (vllm/config/cache.py): the instance checks at start that at
least that much is free, then spends it on weights, activations and KV cache.
Outside that budget each process still holds a CUDA context, and CUDA graphs
unless VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 (launch.sh sets it, so graphs
count inside the budget). `reserve_gib` per server covers what stays outside.

Pure stdlib, so it runs on a GPU host without the gateway's venv:

    python3 deploy/gpu/sizing.py --gpu-gib 140 --target-gib 15 --draft-gib 2.3
    python3 deploy/gpu/sizing.py --gpu-mib 143771 --target-dir /models/t --draft-dir /models/d
    python3 deploy/gpu/sizing.py --examples      # the tables in deploy/README.md

Where the figures come from: GPU memory is nvidia-smi's memory.total (H200:
143771 MiB = 140.4 GiB), weights are the safetensors files' sizes on disk (the
model cards' bf16 checkpoints), KV bytes per token are 2 x layers x KV heads x
head_dim x 2 bytes from each config.json. The overhead and the reserve are
estimates, not measurements: tune them from vLLM's start log (below).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3

# Per-server memory inside the budget besides weights and KV cache: peak
# activations of a profiling forward pass, non-torch allocations (cuBLAS
# workspace), and CUDA graphs. ~3 GiB fits 7-14B models at vLLM's default
# --max-num-batched-tokens; vLLM's log ("Available KV cache memory",
# "Model loading took") gives the real figures to tune it with.
DEFAULT_OVERHEAD_GIB = 3.0
# Per-server memory outside the budget (the CUDA context, ~0.5-1 GiB).
DEFAULT_RESERVE_GIB = 1.0
# The baseline absorbs overflow (the gateway sends to it when the speculative
# server is busy or its KV cache is full), so by default it gets more KV cache.
DEFAULT_SPECULATIVE_KV_SHARE = 0.4
# Below this a server can hold too few sequences to be worth running.
DEFAULT_MIN_KV_GIB = 1.0

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class SizingError(ValueError):
    """The pair does not fit, or the inputs make no sense."""


@dataclass(frozen=True, slots=True)
class ServerShare:
    """One server's part of the GPU."""

    name: str
    weights_gib: float
    overhead_gib: float
    kv_cache_gib: float
    gpu_memory_utilization: float
    kv_bytes_per_token: int | None = None

    @property
    def budget_gib(self) -> float:
        return self.weights_gib + self.overhead_gib + self.kv_cache_gib

    @property
    def kv_cache_memory_bytes(self) -> int:
        """The same KV cache as a `--kv-cache-memory-bytes` value."""
        return int(self.kv_cache_gib * GIB)

    @property
    def kv_tokens(self) -> int | None:
        """Tokens of context the KV cache holds (summed over all sequences)."""
        if not self.kv_bytes_per_token:
            return None
        return self.kv_cache_memory_bytes // self.kv_bytes_per_token


@dataclass(frozen=True, slots=True)
class SplitPlan:
    gpu_gib: float
    reserve_gib: float
    speculative: ServerShare
    baseline: ServerShare

    @property
    def unallocated_gib(self) -> float:
        return self.gpu_gib - self.speculative.budget_gib - self.baseline.budget_gib

    def shell(self) -> str:
        """KEY=VALUE lines that launch.sh reads."""
        s, b = self.speculative, self.baseline
        return (
            f"SPEC_GPU_UTIL={s.gpu_memory_utilization:.3f}\n"
            f"BASE_GPU_UTIL={b.gpu_memory_utilization:.3f}\n"
            f"SPEC_KV_BYTES={s.kv_cache_memory_bytes}\n"
            f"BASE_KV_BYTES={b.kv_cache_memory_bytes}\n"
        )

    def table(self) -> str:
        return GpuPlan(self.gpu_gib, self.reserve_gib, (self.speculative, self.baseline)).table()


@dataclass(frozen=True, slots=True)
class Server:
    """One vLLM server to place on a GPU: its route's name and its draft's weights
    (0 for no speculation, n-gram and MTP: nothing loaded beside the target)."""

    name: str
    speculative: bool = False
    draft_gib: float = 0.0
    draft_kv_bytes_per_token: int | None = None


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """N servers of one target model on one GPU, in the order given."""

    gpu_gib: float
    reserve_gib: float
    shares: tuple[ServerShare, ...]

    @property
    def unallocated_gib(self) -> float:
        return self.gpu_gib - sum(share.budget_gib for share in self.shares)

    def table(self) -> str:
        rows = [f"GPU {self.gpu_gib:.1f} GiB; {self.reserve_gib:.1f} GiB/server outside budgets"]
        width = max(11, *(len(share.name) for share in self.shares))
        for share in self.shares:
            tokens = f", ~{share.kv_tokens:,} KV tokens" if share.kv_tokens else ""
            rows.append(
                f"{share.name:>{width}}: --gpu-memory-utilization"
                f" {share.gpu_memory_utilization:.3f}"
                f" = {share.budget_gib:.1f} GiB (weights {share.weights_gib:.1f}"
                f" + overhead {share.overhead_gib:.1f} + KV {share.kv_cache_gib:.1f}{tokens})"
            )
        rows.append(f"unallocated: {self.unallocated_gib:.1f} GiB")
        return "\n".join(rows)


def plan_servers(
    gpu_gib: float,
    target_gib: float,
    servers: Sequence[Server],
    *,
    overhead_gib: float = DEFAULT_OVERHEAD_GIB,
    reserve_gib: float = DEFAULT_RESERVE_GIB,
    speculative_kv_share: float = DEFAULT_SPECULATIVE_KV_SHARE,
    min_kv_gib: float = DEFAULT_MIN_KV_GIB,
    target_kv_bytes_per_token: int | None = None,
) -> GpuPlan:
    """Split `gpu_gib` between `servers`, all loading the same `target_gib` target.

    KV cache is what is left after every server's weights and overhead and a
    reserve per process; each gets a part by weight (`speculative_kv_share` for
    a speculative server, 1 - that for one without), none under `min_kv_gib`.
    Each fraction is rounded DOWN to 0.001 so the budgets plus the reserves
    never exceed the GPU, whatever the rounding; the KV cache figures are then
    recomputed from the rounded fractions (what vLLM will actually get).
    """
    if gpu_gib <= 0 or target_gib <= 0:
        raise SizingError("gpu_gib and target_gib must be > 0")
    if not servers:
        raise SizingError("no server to place")
    drafts = [server.draft_gib for server in servers]
    if min(*drafts, overhead_gib, reserve_gib, min_kv_gib) < 0:
        raise SizingError("draft_gib, overhead_gib, reserve_gib and min_kv_gib must be >= 0")
    if not 0.0 < speculative_kv_share < 1.0:
        raise SizingError("speculative_kv_share must be strictly between 0 and 1")
    n = len(servers)
    fixed = [target_gib + server.draft_gib + overhead_gib for server in servers]
    kv_total = gpu_gib - n * reserve_gib - sum(fixed)
    if kv_total < n * min_kv_gib:
        need = sum(fixed) + n * (reserve_gib + min_kv_gib)
        raise SizingError(
            f"does not fit: {_count(n)} need {need:.1f} GiB"
            f" ({n}x{target_gib:.1f} target + {sum(drafts):.1f} draft + {n}x{overhead_gib:.1f}"
            f" overhead + {n}x{reserve_gib:.1f} reserve + {n}x{min_kv_gib:.1f} KV) but the GPU"
            f" has {gpu_gib:.1f} GiB; use a smaller or quantized model, fewer routes, or"
            " more GPUs"
        )
    weights = [
        speculative_kv_share if server.speculative else 1.0 - speculative_kv_share
        for server in servers
    ]
    kv = _divide(kv_total, weights, min_kv_gib)

    def share(server: Server, kv_gib: float) -> ServerShare:
        weights_gib = target_gib + server.draft_gib
        fraction = math.floor((weights_gib + overhead_gib + kv_gib) / gpu_gib * 1000) / 1000
        kv_rounded = fraction * gpu_gib - weights_gib - overhead_gib
        bpt = target_kv_bytes_per_token
        if bpt and server.speculative:
            # A draft model keeps its own KV cache in the same blocks (one token
            # slot holds the target's and the draft's layers).
            bpt += server.draft_kv_bytes_per_token or 0
        return ServerShare(server.name, weights_gib, overhead_gib, kv_rounded, fraction, bpt)

    shares = tuple(share(server, kv_gib) for server, kv_gib in zip(servers, kv, strict=True))
    return GpuPlan(gpu_gib=gpu_gib, reserve_gib=reserve_gib, shares=shares)


def _count(n: int) -> str:
    return "two servers" if n == 2 else f"{n} servers" if n != 1 else "one server"


def _divide(total: float, weights: Sequence[float], floor: float) -> list[float]:
    """`total` in proportion to `weights`, each part at least `floor` (the parts
    held at the floor leave the rest to the others, in proportion)."""
    held: dict[int, float] = {}
    while True:
        free = [i for i in range(len(weights)) if i not in held]
        rest = total - sum(held.values())
        weight = sum(weights[i] for i in free)
        parts = {i: rest * weights[i] / weight for i in free}
        low = {i for i, part in parts.items() if part < floor}
        if not low:
            return [held.get(i, parts.get(i, 0.0)) for i in range(len(weights))]
        held.update(dict.fromkeys(low, floor))


def plan_split(
    gpu_gib: float,
    target_gib: float,
    draft_gib: float = 0.0,
    *,
    overhead_gib: float = DEFAULT_OVERHEAD_GIB,
    reserve_gib: float = DEFAULT_RESERVE_GIB,
    speculative_kv_share: float = DEFAULT_SPECULATIVE_KV_SHARE,
    min_kv_gib: float = DEFAULT_MIN_KV_GIB,
    target_kv_bytes_per_token: int | None = None,
    draft_kv_bytes_per_token: int | None = None,
) -> SplitPlan:
    """Split `gpu_gib` of GPU memory between the speculative and baseline servers:
    `plan_servers` for the pair, the speculative one first."""
    plan = plan_servers(
        gpu_gib,
        target_gib,
        (
            Server("speculative", True, draft_gib, draft_kv_bytes_per_token),
            Server("baseline"),
        ),
        overhead_gib=overhead_gib,
        reserve_gib=reserve_gib,
        speculative_kv_share=speculative_kv_share,
        min_kv_gib=min_kv_gib,
        target_kv_bytes_per_token=target_kv_bytes_per_token,
    )
    speculative, baseline = plan.shares
    return SplitPlan(gpu_gib, reserve_gib, speculative, baseline)


def weights_gib(model_dir: str | Path) -> float:
    """Size of a Hugging Face model folder's weight files, in GiB.

    safetensors files when there are any (a folder often ships both formats
    and vLLM loads only those), else *.bin / *.pt files.
    """
    root = Path(model_dir)
    if not root.is_dir():
        raise SizingError(f"{root}: not a directory")
    files = [p for p in root.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES]
    safetensors = [p for p in files if p.suffix == ".safetensors"]
    chosen = safetensors or files
    if not chosen:
        raise SizingError(f"{root}: no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    return sum(p.stat().st_size for p in chosen) / GIB


_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float8": 1, "fp8": 1}


def kv_bytes_per_token(model_dir: str | Path, kv_dtype_bytes: int | None = None) -> int | None:
    """K and V bytes one token takes in every layer, from the folder's config.json.

    None when config.json lacks the fields (e.g. an architecture with a
    compressed KV such as MLA, where this formula would be wrong).
    """
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config", cfg)
    if cfg.get("kv_lora_rank"):  # MLA (DeepSeek-style): not two full K/V heads
        return None
    layers = cfg.get("num_hidden_layers")
    heads = cfg.get("num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or (cfg["hidden_size"] // heads if heads else None)
    if not (layers and kv_heads and head_dim):
        return None
    dtype_bytes = kv_dtype_bytes or _DTYPE_BYTES.get(str(cfg.get("torch_dtype", "")), 2)
    return int(2 * layers * kv_heads * head_dim * dtype_bytes)


# ---- documented example pairs ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    weights_gib: float  # bf16 safetensors, as downloaded
    kv_bytes_per_token: int  # bf16 KV cache


def _kv(layers: int, kv_heads: int, head_dim: int) -> int:
    return 2 * layers * kv_heads * head_dim * 2


LLAMA_31_8B = Model("Llama-3.1-8B-Instruct", 14.96, _kv(32, 8, 128))
LLAMA_32_1B = Model("Llama-3.2-1B-Instruct", 2.30, _kv(16, 8, 64))
EAGLE3_LLAMA_8B = Model("EAGLE3-LLaMA3.1-Instruct-8B", 0.80, _kv(1, 8, 128))
QWEN3_8B = Model("Qwen3-8B", 15.26, _kv(36, 8, 128))
QWEN3_14B = Model("Qwen3-14B", 27.51, _kv(40, 8, 128))
QWEN3_06B = Model("Qwen3-0.6B", 1.40, _kv(28, 8, 128))
NGRAM = Model("n-gram (no weights)", 0.0, 0)

# GPU memory as nvidia-smi reports memory.total, in GiB.
GPUS = {"H200": 140.4, "H100-80GB": 79.6, "L40S": 45.0, "L4": 22.5}

EXAMPLES: tuple[tuple[str, Model, Model], ...] = (
    ("H200", LLAMA_31_8B, LLAMA_32_1B),
    ("H200", LLAMA_31_8B, EAGLE3_LLAMA_8B),
    ("H200", QWEN3_8B, QWEN3_06B),
    ("H100-80GB", LLAMA_31_8B, LLAMA_32_1B),
    ("H100-80GB", LLAMA_31_8B, NGRAM),
    ("H100-80GB", QWEN3_14B, QWEN3_06B),
    ("L40S", LLAMA_31_8B, LLAMA_32_1B),
    ("L4", LLAMA_31_8B, NGRAM),
)


def plan_example(gpu: str, target: Model, draft: Model) -> SplitPlan:
    return plan_split(
        GPUS[gpu],
        target.weights_gib,
        draft.weights_gib,
        target_kv_bytes_per_token=target.kv_bytes_per_token,
        draft_kv_bytes_per_token=draft.kv_bytes_per_token,
    )


def examples_markdown() -> str:
    """The example table of deploy/README.md (a test checks they agree)."""
    lines = [
        "| GPU | target | draft | speculative util | baseline util | KV tokens spec / base |",
        "|---|---|---|---|---|---|",
    ]
    for gpu, target, draft in EXAMPLES:
        head = f"| {gpu} ({GPUS[gpu]} GiB) | {target.name} ({target.weights_gib} GiB)"
        head += f" | {draft.name}" + (f" ({draft.weights_gib} GiB)" if draft.weights_gib else "")
        try:
            plan = plan_example(gpu, target, draft)
        except SizingError:
            lines.append(f"{head} | does not fit | does not fit | - |")
            continue
        s, b = plan.speculative, plan.baseline
        lines.append(
            f"{head} | {s.gpu_memory_utilization:.3f} | {b.gpu_memory_utilization:.3f}"
            f" | {s.kv_tokens:,} / {b.kv_tokens:,} |"
        )
    return "\n".join(lines)


# Several speculation configurations of one target on one GPU: (GPU, target,
# routes as (name, draft or None for no speculation)). n-gram and MTP load nothing
# beside the target (NGRAM); EAGLE3 k=3 and k=7 each load the same head.
ROUTE_EXAMPLES: tuple[tuple[str, Model, tuple[tuple[str, Model | None], ...]], ...] = (
    ("H200", LLAMA_31_8B,
     (("none", None), ("eagle3-k3", EAGLE3_LLAMA_8B), ("eagle3-k7", EAGLE3_LLAMA_8B),
      ("ngram-k8", NGRAM))),
    ("H200", LLAMA_31_8B,
     (("none", None), ("ngram-k4", NGRAM), ("eagle3-k3", EAGLE3_LLAMA_8B))),
    ("H200", QWEN3_8B, (("none", None), ("ngram-k2", NGRAM), ("draft-k4", QWEN3_06B))),
    ("H100-80GB", LLAMA_31_8B,
     (("none", None), ("ngram-k4", NGRAM), ("eagle3-k3", EAGLE3_LLAMA_8B))),
    ("L40S", LLAMA_31_8B,
     (("none", None), ("ngram-k4", NGRAM), ("eagle3-k3", EAGLE3_LLAMA_8B))),
)  # fmt: skip


def plan_route_example(
    gpu: str, target: Model, routes: Sequence[tuple[str, Model | None]]
) -> GpuPlan:
    servers = [
        Server(name, draft is not None, draft.weights_gib if draft else 0.0,
               draft.kv_bytes_per_token if draft else None)
        for name, draft in routes
    ]  # fmt: skip
    return plan_servers(
        GPUS[gpu], target.weights_gib, servers, target_kv_bytes_per_token=target.kv_bytes_per_token
    )


def route_examples_markdown() -> str:
    """The N-route example table of deploy/README.md (a test checks they agree)."""
    lines = [
        "| GPU | target | routes | gpu-memory-utilization | KV tokens |",
        "|---|---|---|---|---|",
    ]
    for gpu, target, routes in ROUTE_EXAMPLES:
        head = f"| {gpu} ({GPUS[gpu]} GiB) | {target.name} | {', '.join(n for n, _ in routes)}"
        try:
            plan = plan_route_example(gpu, target, routes)
        except SizingError:
            lines.append(f"{head} | does not fit | - |")
            continue
        utils = " / ".join(f"{share.gpu_memory_utilization:.3f}" for share in plan.shares)
        tokens = " / ".join(f"{share.kv_tokens:,}" for share in plan.shares)
        lines.append(f"{head} | {utils} | {tokens} |")
    return "\n".join(lines)


# ---- command line -------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="sizing.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument("--gpu-gib", type=float, help="GPU memory in GiB")
    gpu.add_argument("--gpu-mib", type=float, help="GPU memory in MiB (nvidia-smi memory.total)")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--target-gib", type=float, help="target weights in GiB")
    target.add_argument("--target-dir", type=Path, help="target model folder (weights measured)")
    draft = p.add_mutually_exclusive_group()
    draft.add_argument("--draft-gib", type=float, default=0.0, help="draft weights in GiB")
    draft.add_argument("--draft-dir", type=Path, help="draft model folder (weights measured)")
    p.add_argument("--overhead-gib", type=float, default=DEFAULT_OVERHEAD_GIB)
    p.add_argument("--reserve-gib", type=float, default=DEFAULT_RESERVE_GIB)
    p.add_argument("--speculative-kv-share", type=float, default=DEFAULT_SPECULATIVE_KV_SHARE)
    p.add_argument("--min-kv-gib", type=float, default=DEFAULT_MIN_KV_GIB)
    p.add_argument("--format", choices=("table", "shell", "json"), default="table")
    p.add_argument("--examples", action="store_true", help="print the README's example tables")
    args = p.parse_args(argv)

    if args.examples:
        print(examples_markdown())
        print()
        print(route_examples_markdown())
        return 0
    try:
        if args.gpu_gib is None and args.gpu_mib is None:
            raise SizingError("give --gpu-gib or --gpu-mib")
        if args.target_gib is None and args.target_dir is None:
            raise SizingError("give --target-gib or --target-dir")
        gpu_gib = args.gpu_gib if args.gpu_gib is not None else args.gpu_mib / 1024
        target_gib = args.target_gib if args.target_dir is None else weights_gib(args.target_dir)
        draft_gib = args.draft_gib if args.draft_dir is None else weights_gib(args.draft_dir)
        plan = plan_split(
            gpu_gib,
            target_gib,
            draft_gib,
            overhead_gib=args.overhead_gib,
            reserve_gib=args.reserve_gib,
            speculative_kv_share=args.speculative_kv_share,
            min_kv_gib=args.min_kv_gib,
            target_kv_bytes_per_token=kv_bytes_per_token(args.target_dir)
            if args.target_dir
            else None,
            draft_kv_bytes_per_token=kv_bytes_per_token(args.draft_dir) if args.draft_dir else None,
        )
    except SizingError as exc:
        print(f"sizing: {exc}", file=sys.stderr)
        return 2
    if args.format == "shell":
        print(plan.shell(), end="")
    elif args.format == "json":
        out: dict[str, object] = {
            "gpu_gib": plan.gpu_gib,
            "reserve_gib_per_server": plan.reserve_gib,
            "unallocated_gib": round(plan.unallocated_gib, 3),
        }
        for s in (plan.speculative, plan.baseline):
            out[s.name] = {
                "gpu_memory_utilization": s.gpu_memory_utilization,
                "weights_gib": round(s.weights_gib, 3),
                "overhead_gib": s.overhead_gib,
                "kv_cache_gib": round(s.kv_cache_gib, 3),
                "kv_cache_memory_bytes": s.kv_cache_memory_bytes,
                "kv_tokens": s.kv_tokens,
            }
        print(json.dumps(out, indent=2))
    else:
        print(plan.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
