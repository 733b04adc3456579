"""Equivalence and latency gates, reports and plots.

* ``equivalence``  greedy exact match per prompt (first divergence, edit distance) and the
                   sampled distribution check
* ``distribution`` chi-square homogeneity and total variation on token counts
* ``gates``        recipe gates → verdict (deploy speculative / keep baseline)
* ``run``          :func:`run_validation`: all of it through a running server
* ``report``       report.json, report.md and the PNG plots (``plots``)
"""
