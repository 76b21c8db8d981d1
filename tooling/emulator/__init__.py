"""An emulated vLLM OpenAI server, timed like a GPU engine (`specroute emulate`).

It speaks vLLM's API and /metrics for one model name and times tokens like an
engine with continuous batching, without speculative decoding, with it, or with
vLLM's dynamic speculative decoding (K per batch size, dynamic.py), so the
router, the bench and the tests can see GPU-shaped economics on any machine.
Everything it prints says it is emulated. See CALIBRATION.md for the model.
"""

from .app import create_emulator_app
from .cli import main
from .config import EmulatorConfig, add_emulator_arguments, config_from_args
from .engine import SharedGpu
from .generation import ACCEPTANCE_HEADER, EMULATOR, EmulatorState

__all__ = [
    "ACCEPTANCE_HEADER",
    "EMULATOR",
    "EmulatorConfig",
    "EmulatorState",
    "SharedGpu",
    "add_emulator_arguments",
    "config_from_args",
    "create_emulator_app",
    "main",
]
