"""A run's numbers and their outputs: metrics and metrics.jsonl, evaluation, distributions,
TensorBoard, plots, progress."""
