"""The trainer: runs a TrainConfig end to end (``advisor train``)."""

from advisor.trainer.loop import RunOptions, TrainingInterrupted, TrainResult, train

__all__ = ["RunOptions", "TrainResult", "TrainingInterrupted", "train"]
