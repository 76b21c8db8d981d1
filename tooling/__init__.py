"""Everything that runs beside the gateway, never inside it.

The emulated vLLM server, the load generator and its workloads, `specroute
bench | demo | advise | train`, and the in-process stack the tests and
benchmarks start. `specroute serve` imports none of this: production code
lives in gateway/ and classifier/, and tooling may depend on them, never the
other way round.
"""
