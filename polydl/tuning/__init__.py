"""Tuning that is remembered and predicted: the schedule search space, honest measurements in
a child process, the performance database, the learned cost model, distributed tuning on Ray
and the `schedule="tuned"` lookup."""
