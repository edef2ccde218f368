"""What runs around each step of the loop: warm start, held-out evaluation, preflight, teacher, checkpoints,
metrics and the summary."""
