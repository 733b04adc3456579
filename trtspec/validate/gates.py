"""Rollout gates → verdict. Every gate must pass to deploy speculative; otherwise keep the baseline.

A gate whose value could not be measured fails: the verdict must be earned, not assumed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

DEPLOY = "deploy speculative"
KEEP = "keep baseline"


@dataclass
class GateResult:
    name: str
    passed: bool
    value: float | None
    threshold: float
    comparison: str  # ">=" | "<="
    detail: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Verdict:
    gates: list[GateResult] = field(default_factory=list)

    @property
    def deploy_speculative(self) -> bool:
        return bool(self.gates) and all(g.passed for g in self.gates)

    @property
    def decision(self) -> str:
        return DEPLOY if self.deploy_speculative else KEEP

    @property
    def failed(self) -> list[GateResult]:
        return [g for g in self.gates if not g.passed]

    def to_dict(self) -> dict:
        return {"decision": self.decision, "deploy_speculative": self.deploy_speculative,
                "gates": [g.to_dict() for g in self.gates], "failed": [g.name for g in self.failed]}


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "not measured"
    return f"{v:.1%}" if pct else f"{v:.3f}"


def evaluate(gates, *, mismatch_rate: float | None, exact_match_rate: float | None, tolerance: int,
             speedup: float | None, acceptance_rate: float | None, acceptance_source: str,
             sampled=None) -> Verdict:
    """``gates`` is the recipe's ``validation.gates`` (``trtspec.config.Gates``)."""
    v = Verdict()
    tol = "exact" if tolerance == 0 else f"first {tolerance} tokens"
    v.gates.append(GateResult(
        "greedy equivalence", mismatch_rate is not None and mismatch_rate <= gates.max_mismatch_rate,
        mismatch_rate, gates.max_mismatch_rate, "<=",
        f"mismatch rate {_fmt(mismatch_rate, True)} ({tol}; exact matches {_fmt(exact_match_rate, True)}), "
        f"allowed {gates.max_mismatch_rate:.1%}"))
    v.gates.append(GateResult(
        "speedup", speedup is not None and speedup >= gates.min_speedup, speedup, gates.min_speedup, ">=",
        f"output tokens/s speculative / baseline at concurrency {gates.at_concurrency}: "
        f"{'not measured' if speedup is None else f'{speedup:.2f}x'}, needs >= {gates.min_speedup:.2f}x"))
    v.gates.append(GateResult(
        "acceptance", acceptance_rate is not None and acceptance_rate >= gates.min_acceptance_rate,
        acceptance_rate, gates.min_acceptance_rate, ">=",
        f"acceptance rate {_fmt(acceptance_rate)} ({acceptance_source}), needs >= {gates.min_acceptance_rate:.2f}"))
    if sampled is not None:  # an equivalence.SampledResult
        v.gates.append(GateResult(
            "sampled distribution", sampled.passed, sampled.min_p_value, sampled.threshold, ">=",
            f"{len(sampled.tests)} chi-square tests (speculative vs baseline token frequencies, "
            f"{sampled.samples} samples each): min p = {_fmt(sampled.min_p_value)}, needs >= "
            f"{sampled.threshold:.2g} (alpha {sampled.alpha:g}, Bonferroni); max total variation "
            f"{_fmt(sampled.max_total_variation)}"
            + ("" if sampled.conclusive else "; INCONCLUSIVE: no speculated position had two categories with "
               "enough samples to compare; raise validation.sampled_check_samples")))
    return v
