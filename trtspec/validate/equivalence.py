"""Output equivalence of the speculative path against ordinary decoding, through the server.

Greedy: speculative decoding is lossless, so each prompt's tokens must equal the baseline's. We
report, per prompt, the first index where they differ, the token edit distance and the text
around the divergence — never just pass/fail: batched verification and FP8 targets can shift a
greedy argmax upstream (reference/trtllm-triton.md §8.4), and the reader must see where.
A tolerance ``T`` (recipe ``validation.equivalence_tolerance``) lets a prompt pass when its first
``T`` tokens agree; ``T = 0`` means exact.

Sampled: one sample says nothing, so the check is statistical — many short continuations per
prompt from each model, and a chi-square test of homogeneity per token position (speculative vs
baseline), with the total-variation distance as the effect size. Position 0 is the prefill's
token (no speculation: a control); later positions come from verification steps.
"""

from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from trtspec.client.client import AsyncLLMClient
from trtspec.client.loadgen import run_all
from trtspec.client.types import GenerationResult, Sampling
from trtspec.validate.distribution import chi_square_homogeneity, pooled_total_variation


def first_divergence(a: Sequence, b: Sequence) -> int | None:
    """First index where ``a`` and ``b`` differ; the shorter length if one is a prefix of the
    other; ``None`` when identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance over tokens (insert, delete, substitute: cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


@dataclass
class PromptComparison:
    index: int
    prompt: str
    baseline: list  # token ids (or characters when the server sends no ids and there is no tokenizer)
    speculative: list
    baseline_text: str
    speculative_text: str
    first_divergence: int | None
    edit_distance: int
    passed: bool
    served_by: str | None = None
    # character offsets of the first divergence in each text (exact with a tokenizer, else estimated)
    divergence_chars: tuple[int, int] | None = None

    @property
    def exact(self) -> bool:
        return self.first_divergence is None

    def context(self, width: int = 24) -> dict | None:
        """Text around the divergence: the common prefix's tail and each side's continuation."""
        i = self.first_divergence
        if i is None:
            return None
        if self.divergence_chars is not None:
            cut_b, cut_s = self.divergence_chars
        elif self.baseline and isinstance(self.baseline[0], str):  # compared as characters
            cut_b = cut_s = i
        else:  # no tokenizer: estimate by the share of tokens
            cut_b = _text_at(self.baseline_text, i, len(self.baseline))
            cut_s = _text_at(self.speculative_text, i, len(self.speculative))
        common, b, s = self.baseline_text[:cut_b], self.baseline_text[cut_b:], self.speculative_text[cut_s:]
        return {"common_tail": common[-width:], "baseline": b[:width], "speculative": s[:width]}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["exact"] = self.exact
        d["context"] = self.context()
        return d


def _text_at(text: str, i: int, n: int) -> int:
    return round(len(text) * i / n) if n else 0


@dataclass
class EquivalenceResult:
    tolerance: int
    max_tokens: int
    concurrency: int
    unit: str  # "tokens" | "chars"
    prompts: list[PromptComparison] = field(default_factory=list)
    # what was compared: "server token ids" | "tokenizer token ids (text re-encoded)" | "text"
    compared: str = ""

    @property
    def exact_match_rate(self) -> float:
        return sum(p.exact for p in self.prompts) / len(self.prompts) if self.prompts else 0.0

    @property
    def mismatch_rate(self) -> float:
        """Share of prompts that fail under the tolerance (what the gate checks)."""
        return sum(not p.passed for p in self.prompts) / len(self.prompts) if self.prompts else 1.0

    def to_dict(self) -> dict:
        divs = [p.first_divergence for p in self.prompts if p.first_divergence is not None]
        return {
            "tolerance": self.tolerance,
            "max_tokens": self.max_tokens,
            "concurrency": self.concurrency,
            "unit": self.unit,
            "compared": self.compared,
            "prompts_compared": len(self.prompts),
            "exact_matches": sum(p.exact for p in self.prompts),
            "exact_match_rate": self.exact_match_rate,
            "mismatch_rate": self.mismatch_rate,
            "earliest_divergence": min(divs) if divs else None,
            "mean_edit_distance": (sum(p.edit_distance for p in self.prompts) / len(self.prompts))
            if self.prompts else None,
            "per_prompt": [p.to_dict() for p in self.prompts],
        }


def compare(index: int, prompt: str, base: GenerationResult, spec: GenerationResult, tolerance: int,
            tokenizer=None) -> PromptComparison:
    if base.token_ids is not None and spec.token_ids is not None:
        a, b = list(base.token_ids), list(spec.token_ids)
    else:
        a, b = list(base.text), list(spec.text)
    div = first_divergence(a, b)
    passed = div is None or (tolerance > 0 and div >= tolerance)
    chars = None
    if div is not None and tokenizer is not None and base.token_ids is not None and spec.token_ids is not None:
        chars = (len(tokenizer.decode(a[:div])), len(tokenizer.decode(b[:div])))
    return PromptComparison(index=index, prompt=prompt, baseline=a, speculative=b, baseline_text=base.text,
                            speculative_text=spec.text, first_divergence=div, edit_distance=edit_distance(a, b),
                            passed=passed, served_by=spec.served_by, divergence_chars=chars)


async def _map(fn, items: list, concurrency: int, on_done: Callable[[], None] | None = None) -> list:
    """Run ``fn`` over items with ``concurrency`` in flight; results in input order."""
    out: list = [None] * len(items)
    queue = list(reversed(list(enumerate(items))))

    async def worker():
        while queue:
            i, item = queue.pop()
            out[i] = await fn(item)
            if on_done:
                on_done()

    await run_all(worker() for _ in range(max(1, min(concurrency, len(items)))))
    return out


async def greedy_equivalence(client: AsyncLLMClient, prompts: Sequence[str], *, max_tokens: int, tolerance: int,
                             speculative_model: str, baseline_model: str, concurrency: int = 1,
                             on_done: Callable[[], None] | None = None) -> EquivalenceResult:
    """Greedy outputs of both models for every prompt, compared token by token."""
    greedy = Sampling(max_tokens=max_tokens, temperature=0.0)
    base = await _map(lambda p: client.generate(p, greedy, model=baseline_model), list(prompts), concurrency, on_done)
    spec = await _map(lambda p: client.generate(p, greedy, model=speculative_model), list(prompts), concurrency, on_done)
    unit = "tokens" if all(r.token_ids is not None for r in base + spec) else "chars"
    sources = {r.token_ids_source for r in base + spec}
    compared = ("server token ids" if sources == {"server"} else "text" if unit == "chars"
                else "tokenizer token ids (text re-encoded)")
    res = EquivalenceResult(tolerance=tolerance, max_tokens=max_tokens, concurrency=concurrency, unit=unit,
                            compared=compared)
    res.prompts = [compare(i, p, b, s, tolerance, client.tokenizer)
                   for i, (p, b, s) in enumerate(zip(prompts, base, spec))]
    return res


@dataclass
class PositionTest:
    prompt_index: int
    position: int
    n_baseline: int
    n_speculative: int
    categories: int  # after pooling rare tokens
    chi2: float
    dof: int
    p_value: float
    total_variation: float  # over the pooled categories the test compares (raw TV of sparse samples is biased up)
    top_baseline: list  # [(token, share)] most frequent
    top_speculative: list


@dataclass
class SampledResult:
    samples: int  # per prompt and model
    length: int  # tokens per continuation
    alpha: float  # family-wise; each test uses alpha / number of tests (Bonferroni)
    sampling: dict
    tests: list[PositionTest] = field(default_factory=list)

    @property
    def threshold(self) -> float:
        return self.alpha / max(1, len(self.tests))

    @property
    def conclusive(self) -> bool:
        """At least one speculated position (>= 1) had two or more categories to compare."""
        return any(t.position >= 1 and t.dof >= 1 for t in self.tests)

    @property
    def passed(self) -> bool:
        return self.conclusive and all(t.p_value >= self.threshold for t in self.tests)

    @property
    def min_p_value(self) -> float | None:
        return min((t.p_value for t in self.tests), default=None)

    @property
    def max_total_variation(self) -> float | None:
        return max((t.total_variation for t in self.tests), default=None)

    def to_dict(self) -> dict:
        return {"samples": self.samples, "length": self.length, "alpha": self.alpha,
                "per_test_threshold": self.threshold, "passed": self.passed, "conclusive": self.conclusive, "min_p_value": self.min_p_value,
                "max_total_variation": self.max_total_variation, "sampling": self.sampling,
                "tests": [asdict(t) for t in self.tests]}


def _top(c: collections.Counter, n: int = 5) -> list:
    total = sum(c.values())
    return [(tok, round(k / total, 4)) for tok, k in c.most_common(n)]


async def sampled_check(client: AsyncLLMClient, prompts: Sequence[str], sampling: Sampling, *, samples: int,
                        speculative_model: str, baseline_model: str, length: int = 3, alpha: float = 1e-3,
                        concurrency: int = 4, seed: int = 0,
                        on_done: Callable[[], None] | None = None) -> SampledResult:
    """``samples`` continuations of ``length`` tokens per prompt and model; chi-square per position.

    ``length`` 3 is the shortest that speculates: the prefill emits token 0, and a verify step with
    one draft token emits tokens 1 and 2 (the engine drafts at most remaining − 1 tokens).
    Seeds are disjoint between the models (baseline even, speculative odd) so the samples are
    independent draws."""
    res = SampledResult(samples=samples, length=length, alpha=alpha,
                        sampling={k: v for k, v in asdict(sampling).items() if k != "max_tokens"})
    for pi, prompt in enumerate(prompts):
        per_model = {}
        for parity, model in ((0, baseline_model), (1, speculative_model)):
            def one(i, model=model, parity=parity):
                s = sampling.with_(max_tokens=length, seed=seed + 2 * (pi * samples + i) + parity)
                return client.generate(prompt, s, model=model)
            outs = await _map(one, list(range(samples)), concurrency, on_done)
            per_model[model] = [r.token_ids if r.token_ids is not None else list(r.text) for r in outs]
        for pos in range(length):
            cb = collections.Counter(o[pos] for o in per_model[baseline_model] if len(o) > pos)
            cs = collections.Counter(o[pos] for o in per_model[speculative_model] if len(o) > pos)
            if not cb or not cs:
                continue
            chi2, dof, p, k = chi_square_homogeneity(cb, cs)
            res.tests.append(PositionTest(
                prompt_index=pi, position=pos, n_baseline=sum(cb.values()), n_speculative=sum(cs.values()),
                categories=k, chi2=chi2, dof=dof, p_value=p, total_variation=pooled_total_variation(cb, cs),
                top_baseline=_top(cb), top_speculative=_top(cs)))
    return res
