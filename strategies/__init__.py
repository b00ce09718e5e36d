"""Pure arithmetic over records: TrainConfig, search space, cost model, search. No device code."""
