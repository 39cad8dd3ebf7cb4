"""Point-to-point transport over torch.distributed (gloo on CPU, NCCL on GPU)."""
