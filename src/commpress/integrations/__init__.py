"""Adapters to PyTorch's own contracts: FSDP2's custom collectives, DDP's comm hooks."""
