"""The trainer: runs a TrainConfig end to end (``advisor train``); entry: ``loop.train``.

Nothing is re-exported here: ``advisor.workload`` imports ``advisor.trainer.step``, and an eager
import of ``loop`` (which imports the workload) would make that circular.
"""
