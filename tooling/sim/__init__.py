"""The router in virtual time: simulations that run a policy over thousands of
requests in seconds, with no clock, no HTTP and no server.

- pair.py: a synthetic pair, a GPU per server (the engine's shape, lognormal noise).
- shared_gpu.py: the emulator's measured step costs, two servers (or N routes, each its
  drafter and k) time-sliced on one GPU or a GPU each (docs/decision.md's results,
  benchmarks/one_gpu_scenarios.py; N routes: docs/routes.md, benchmarks/n_routes.py).

The tests assert what they show (tests/classifier/test_*_simulation.py); the
benchmarks print it. Each prints a table of its own:

    .venv/bin/python -m tooling.sim.pair
    .venv/bin/python -m tooling.sim.shared_gpu
"""
