"""The tuner's stored knowledge: the schedule search space, the performance database and its
records, the features and learned cost model, and the `schedule="tuned"` lookup.

It sits below the driver (the pipeline reads `lookup`) and imports nothing above it; measuring,
the search, distributed tuning and the tuning CLI are `polydl.tuner`, above the driver."""
