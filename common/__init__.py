"""What every DS2 Rosetta notebook shares; NumPy only, no framework import.

- :mod:`common.spec`      the model configuration (:class:`DS2Config`) and presets (:func:`get_preset`)
- :mod:`common.data`      the DeepMark synthetic-utterance iterator (:class:`DeepMarkIterator`)
- :mod:`common.weights`   canonical initial weights (:func:`canonical_weights`)
- :mod:`common.reference` the NumPy model and CTC loss every first loss is checked against
- :mod:`common.checks`    loss / parameter-count / checksum checks
- :mod:`common.timing`    the timing protocol (:class:`BenchmarkTimer`)
- :mod:`common.results`   result records and the comparison table
- :mod:`common.envinfo`   OS, CPU, GPU, driver facts

Runs on Python 3.6 (CNTK's interpreter, with the ``dataclasses`` backport) through 3.12.
"""
