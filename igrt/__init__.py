"""igrt: the real torch.distributed runtime — sparsifiers, residuals, the synchronizer, the DDP hook."""
