"""`specroute gpu measure | build`: emulate your own GPU (docs/own-gpu.md).

`measure` times the step costs of the user's target and drafters on their own CUDA
machine with measure_steps.py, the script that measured the shipped H200 profiles: it
needs only torch (a vLLM install has it), and the shapes, from a config.json or by
name. `build` turns such a run into a profile file, which `--gpu-profile PATH` runs in
`emulate`, `demo`, `bench --emulate` and `serve --emulate`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gateway.commands import Help
from tooling.emulator.gpu import build
from tooling.emulator.gpu.profile import GpuProfile
from tooling.emulator.gpu.shapes import NAMED, DrafterChoice, model_shape

SCRIPT = Path(build.__file__).resolve().parent / "measured" / "measure_steps.py"
PARTS = ("target", "draft", "pair", "extra")


HELP = Help(
    "measure your own GPU's step costs, build a profile the emulator runs (--gpu-profile)",
    "`gpu measure` times your target's and drafters' steps on this CUDA machine (needs "
    "only torch); `gpu build` turns the run into a profile file for --gpu-profile PATH in "
    "emulate, demo, bench and serve --emulate. docs/own-gpu.md.",
    (
        "specroute gpu measure --model /models/Llama-3.1-8B-Instruct "
        "--drafter draft=/models/Llama-3.2-1B-Instruct --drafter ngram --out run/",
        "specroute gpu build run/steps.jsonl -o my-gpu.json   # then --gpu-profile my-gpu.json",
    ),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="gpu_command", required=True, metavar="{measure,build}")
    m = sub.add_parser(
        "measure",
        help="time the step costs of your model and drafters on this CUDA machine (needs torch)",
        description="Run measure_steps.py on this machine's GPU with your target's and "
        "drafters' shapes (random weights: a step's time does not depend on their values). "
        "About 2 minutes on an H200 for an 8B target. Writes OUT/steps.jsonl for `gpu build`.",
    )
    m.add_argument(
        "--model",
        required=True,
        metavar="CONFIG_OR_SHAPE",
        help=f"the target: its config.json (or the model folder) or a shape: {', '.join(NAMED)}",
    )
    m.add_argument(
        "--drafter",
        action="append",
        default=[],
        type=DrafterChoice.parse,
        metavar="NAME=CONFIG_OR_SHAPE",
        help="a drafter as the profile will name it (repeat for several): a draft model's or "
        "EAGLE-3 head's config.json or shape, or NAME=ngram (no model pass); e.g. "
        "--drafter draft=/models/Llama-3.2-1B --drafter ngram",
    )
    m.add_argument("--name", default="", help="the profile's name (default: own-GPU + target)")
    m.add_argument("--out", type=Path, default=Path("gpu-run"), help="folder for steps.jsonl")
    m.add_argument(
        "--parts",
        default="target,draft,pair",
        help=f"what to time, of {','.join(PARTS)} (pair: the two servers on one GPU, with "
        "the first model drafter; extra: k up to 7)",
    )
    m.add_argument(
        "--python",
        default=sys.executable,
        help="the Python that has torch, e.g. vLLM's venv (default: this one)",
    )
    m.add_argument(
        "--small",
        action="store_true",
        help="tiny shapes, timed eagerly, CPU allowed: checks the setup, measures no GPU",
    )
    b = sub.add_parser(
        "build",
        help="turn `gpu measure` runs into a profile file for --gpu-profile",
        description="Regroup the rows of one or more `gpu measure` runs into the emulator's "
        "profile (tables by batch, query tokens, context and prefill, with the run's "
        "provenance). Nothing is fitted.",
    )
    b.add_argument(
        "runs", nargs="+", type=Path, metavar="RUN.jsonl", help="steps.jsonl of `gpu measure`"
    )
    b.add_argument(
        "-o", "--out", type=Path, required=True, metavar="PROFILE.json", help="the profile file"
    )
    b.add_argument("--name", default=None, help="the profile's name (default: the run's)")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    try:
        if args.gpu_command == "measure":
            return measure(args)
        return build_file(args.runs, args.out, args.name, argv)
    except ValueError as exc:
        print(f"specroute gpu {args.gpu_command}: {exc}", file=sys.stderr)
        return 2


def measurement_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The SHAPES file measure_steps.py reads: the target, the drafters, the pair's one."""
    target = model_shape(args.model)
    path = Path(args.model).resolve()
    label = args.model if args.model in NAMED else path.name if path.is_dir() else path.stem
    if label == "config":  # a model folder's config.json: the folder names the model
        label = path.parent.name
    drafters = [d.setup() for d in args.drafter]
    names = [d["drafter"] for d in drafters]
    if len(set(names)) != len(names):
        raise ValueError(f"--drafter names must differ, got {names}")
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or set(parts) - set(PARTS):
        raise ValueError(f"--parts {args.parts!r}: want some of {','.join(PARTS)}")
    modelled = [d["drafter"] for d in drafters if "name" in d]
    return {
        "name": args.name or f"own-gpu-{label}",
        "target": {"name": label, "source": args.model, **target},
        "drafters": drafters,
        "pair": modelled[0] if modelled and "pair" in parts else None,
        "parts": parts,
    }


def _torch_check(python: str, small: bool) -> None:
    """torch importable in `python`, and CUDA unless --small; else a ValueError saying how."""
    probe = "import torch; print(torch.__version__, torch.cuda.is_available())"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except OSError as exc:
        raise ValueError(f"--python {python}: cannot run it ({exc.strerror})") from None
    if done.returncode != 0:
        raise ValueError(
            f"needs torch, which {python} cannot import; run it where vLLM is installed, or "
            "name vLLM's Python with --python"
        )
    version, cuda = done.stdout.split()[-2:]
    if cuda != "True" and not small:
        raise ValueError(
            f"torch {version} in {python} sees no CUDA device: `gpu measure` times a GPU "
            "(--small checks the setup on a CPU with tiny shapes)"
        )


def measure(args: argparse.Namespace) -> int:
    spec = measurement_spec(args)
    out: Path = args.out
    if (out / "steps.jsonl").exists():
        raise ValueError(f"{out / 'steps.jsonl'} exists: the run appends; choose another --out")
    _torch_check(args.python, args.small)
    out.mkdir(parents=True, exist_ok=True)
    shapes = out / "shapes.json"
    shapes.write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")
    env = dict(os.environ, SHAPES=str(shapes.resolve()), OUT=str(out.resolve()))
    if args.small:
        env["SMALL"] = "1"
    print(f"specroute gpu measure: {SCRIPT} {' '.join(spec['parts'])} -> {out}/steps.jsonl")
    code = subprocess.call([args.python, str(SCRIPT), *spec["parts"]], env=env)
    if code:
        print(f"specroute gpu measure: measure_steps.py exited {code}", file=sys.stderr)
        return 1
    print(f"next: specroute gpu build {out}/steps.jsonl -o {spec['name']}.json")
    return 0


def build_file(runs: list[Path], out: Path, name: str | None, argv: list[str]) -> int:
    rows = build.read_rows(runs)
    spec = build.spec_from_run(
        rows, name, ", ".join(str(r) for r in runs), "specroute gpu " + " ".join(argv)
    )
    notes: list[str] = []
    raw = build.build_profile(rows, spec, notes)
    profile = GpuProfile.from_json(raw)  # what --gpu-profile will read, checked now
    out.write_text(build.render(raw), encoding="utf-8")
    for note in notes:
        print(f"specroute gpu build: {note}", file=sys.stderr)
    drafters = ", ".join(profile.drafters) or "none (target only: baseline servers only)"
    print(f"wrote {out}: {profile.describe()}; drafters: {drafters}")
    print(f"emulate it: specroute demo --gpu-profile {out}")
    return 0
