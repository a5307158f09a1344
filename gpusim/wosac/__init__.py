"""WOSAC (Waymo Open Sim Agents Challenge, 2025 config) realism metrics on torch tensors.

* :mod:`gpusim.wosac.config`: the challenge's settings as one table, each value with its source.
* :mod:`gpusim.wosac.scene`: a scenario (``Scenario`` proto) as arrays; batches of them.
* :mod:`gpusim.wosac.features`: the per-step features, batched over scenarios x rollouts.
* :mod:`gpusim.wosac.metrics`: likelihoods, buckets and the meta-metric.
* :mod:`gpusim.wosac.baselines`: rollouts built from the log (log replay, constant speed).
* :mod:`gpusim.wosac.sources`: scenarios from TFRecord / JSON files as ``Scenario`` protos.
* :mod:`gpusim.wosac.rollouts`: submitted or simulated rollouts matched to a scene's sim agents.
* ``python -m gpusim.wosac``: figures of log baselines or a submission file (docs/wosac.md).
"""
