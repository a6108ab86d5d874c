"""What a run leaves behind: the run directory, log files, and tracking backends (TensorBoard, W&B)."""
