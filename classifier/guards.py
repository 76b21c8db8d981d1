"""The guards every policy obeys: when the speculative server is spared whatever the
decision rule says (its KV cache nearly full, a batch nothing measured prices)."""

from __future__ import annotations

from dataclasses import dataclass

from classifier.types import BackendState

__all__ = ["DEFAULT_GUARDS", "UNPRICED_SPEC_MAX_INFLIGHT", "GuardsConfig"]


# The speculative batch spared where nothing measured prices it: a rule of thumb, set on
# the emulator's first (unmeasured) GPU, where speculation stopped paying at batch ~35.
UNPRICED_SPEC_MAX_INFLIGHT = 16


@dataclass(frozen=True, slots=True)
class GuardsConfig:
    """When the speculative server is spared, whatever the policy: there a draft costs
    every request on that server (KV per step, compute a big batch no longer has).

    The batch limit, unset, is the policy's: a policy with a measured step curve prices a
    big batch itself (on the measured H200 the 1B draft still pays on structured output
    at batch ~128, where a fixed 16 split one GPU's batch over both servers: c=32,
    docs/benchmarks.md), and one without (the rules, the profiled policy on its
    built-in prior) spares the server at UNPRICED_SPEC_MAX_INFLIGHT."""

    spec_max_inflight: int | None = None  # speculative load (BackendState.load) at/above this
    spec_max_kv_usage: float = 0.9  # speculative KV cache usage at/above this

    def __post_init__(self) -> None:
        if self.spec_max_inflight is not None and self.spec_max_inflight < 1:
            raise ValueError(f"spec_max_inflight must be >= 1, got {self.spec_max_inflight}")
        if not 0.0 < self.spec_max_kv_usage <= 1.0:
            raise ValueError(
                f"spec_max_kv_usage must be within (0, 1], got {self.spec_max_kv_usage}"
            )

    def max_inflight(self, *, batch_priced: bool = False) -> int | None:
        """The speculative batch that is spared: as configured, else none for a policy
        whose measured step curve prices the batch, else UNPRICED_SPEC_MAX_INFLIGHT."""
        if self.spec_max_inflight is not None:
            return self.spec_max_inflight
        return None if batch_priced else UNPRICED_SPEC_MAX_INFLIGHT

    def reason(
        self,
        spec: BackendState,
        *,
        batch_priced: bool = False,
        lightest_other: int | None = None,
    ) -> str | None:
        """The reason to spare the speculative server now (kv-pressure, spec-busy), or None.

        `lightest_other`: the load of the least loaded server without speculation that
        would answer instead. A busy speculative server is spared only for one that is
        less loaded: moving a request to a busier server is never the lighter choice
        (the chaos run sent a probe from 33 running to 34 and it waited 2.8x)."""
        if spec.kv_cache_usage is not None and spec.kv_cache_usage >= self.spec_max_kv_usage:
            return "kv-pressure"
        limit = self.max_inflight(batch_priced=batch_priced)
        lighter = lightest_other is None or lightest_other < spec.load
        if limit is not None and spec.load >= limit and lighter:
            return "spec-busy"
        return None


DEFAULT_GUARDS = GuardsConfig()
