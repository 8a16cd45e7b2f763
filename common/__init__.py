"""What every DS2 Rosetta notebook shares; NumPy only, no framework import.

- :mod:`common.spec`      the model configuration (:class:`DS2Config`) and presets (:func:`get_preset`)
- :mod:`common.data`      the DeepMark synthetic-utterance iterator (:class:`DeepMarkIterator`)
- :mod:`common.weights`   canonical initial weights (:func:`canonical_weights`)
- :mod:`common.reference` the NumPy model and CTC loss every first loss is checked against
- :mod:`common.checks`    loss / parameter-count / checksum checks
- :mod:`common.timing`    the timing protocol (:class:`BenchmarkTimer`)
- :mod:`common.results`   result records and the comparison table
- :mod:`common.envinfo`   OS, CPU, GPU, driver facts
- :mod:`common.exports`   the canonical weights file every notebook exports, and its checks
- :mod:`common.onnx_check` the ONNX route's check against the framework's own logits
- :mod:`common.labels`    CNTK's per-frame CTC labels
- :mod:`common.flops`, :mod:`common.roofline`, :mod:`common.profile` FLOPs, rooflines and profile shares
- :mod:`common.parallel`  data-parallel shards and rank facts
- :mod:`common.processes` a process named by its pid and start time (is a run's runner still alive?)
- :mod:`common.compile_cache` the persistent XLA caches' directories and counters
- :mod:`common.corpus`    the real task's corpus, spoken offline (espeak-ng, flite), and its iterator
- :mod:`common.decode`    greedy CTC decoding and the character error rate

Runs on Python 3.6 (CNTK's interpreter, with the ``dataclasses`` backport) through 3.12.
"""
