"""The measured GPUs the emulator runs on: profiles built from measured/ (see build.py)."""
