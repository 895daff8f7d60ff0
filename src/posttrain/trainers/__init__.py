"""Training loops. Each loop is plain PyTorch and reads top to bottom."""
